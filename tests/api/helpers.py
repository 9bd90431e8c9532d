"""Small helpers shared by the API tests."""

from __future__ import annotations

from typing import Any

import httpx


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


def error(response: httpx.Response, status: int, field: str | None = "?") -> dict[str, Any]:
    """Assert an error answer with the API's error shape, and no server internals."""
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    body: dict[str, Any] = response.json()
    assert body["status_code"] == status
    assert isinstance(body["detail"], str) and body["detail"]
    if field != "?":
        assert body["field"] == field, body
    return body


async def pool_with_policy(
    client: httpx.AsyncClient,
    *,
    pool: str = "p",
    capacity: dict[str, int] | None = None,
    subject: str = "team",
    **policy: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    p = ok(
        await client.post("/v1/pools", json={"name": pool, "capacity": capacity or {"gpu": 8}}),
        201,
    )
    pol = ok(
        await client.post("/v1/policies", json={"subject": subject, "pool": pool, **policy}), 201
    )
    return p, pol


async def make_request(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    body.setdefault("subject", "team")
    result: dict[str, Any] = ok(await client.post("/v1/requests", json=body), 201)
    return result
