"""HTTP checks and the small setups the API, CLI and fault tests share."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

__all__ = [
    "contended_pool",
    "error",
    "get_request",
    "make_request",
    "ok",
    "one_gpu_request",
    "team_gpu",
    "pool_with_policy",
    "serves_again",
]


def ok(response: httpx.Response, status: int = 200) -> Any:
    """Assert ``status``; the JSON body (None when empty)."""
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
    """Create pool ``pool`` and a policy of ``subject`` on it; both answers."""
    p = ok(
        await client.post("/v1/pools", json={"name": pool, "capacity": capacity or {"gpu": 8}}),
        201,
    )
    pol = ok(
        await client.post("/v1/policies", json={"subject": subject, "pool": pool, **policy}), 201
    )
    return p, pol


async def make_request(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    """POST /v1/requests (subject ``team`` unless given) that must create; the answer."""
    body.setdefault("subject", "team")
    result: dict[str, Any] = ok(await client.post("/v1/requests", json=body), 201)
    return result


async def one_gpu_request(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    """Pool ``p`` of one GPU with a policy of ``team``, then the first request for that GPU
    (``body``: its other fields); the answer."""
    await pool_with_policy(client, capacity={"gpu": 1})
    return await make_request(client, resources={"gpu": 1}, **body)


async def get_request(client: httpx.AsyncClient, request_id: object) -> dict[str, Any]:
    """GET /v1/requests/ID that must answer 200; the request."""
    found: dict[str, Any] = ok(await client.get(f"/v1/requests/{request_id}"))
    return found


async def serves_again(client: httpx.AsyncClient) -> bool:
    """True when the API reads and writes again: a pool list, then a create and its cancel."""
    try:
        if (await client.get("/v1/pools", timeout=5)).status_code != 200:
            return False
        body = {"subject": "a", "resources": {"gpu": 1}, "idempotency_key": str(uuid.uuid4())}
        r = await client.post("/v1/requests", json=body, timeout=5)
        if r.status_code != 201:
            return False
        await client.post(f"/v1/requests/{r.json()['id']}/cancel", timeout=5)
        return True
    except httpx.TransportError:
        return False


async def contended_pool(client: httpx.AsyncClient) -> None:
    """Pool ``p`` of 6 GPUs: subject ``a`` reserves 3, ``b`` only borrows (preemption happens)."""
    await pool_with_policy(client, capacity={"gpu": 6}, subject="a", reserved={"gpu": 3})
    ok(await client.post("/v1/policies", json={"subject": "b", "pool": "p", "reserved": {}}), 201)


def team_gpu(**kw: Any) -> dict[str, Any]:
    """A create body: one GPU of pool ``p`` for subject ``team`` (``kw``: other fields)."""
    return {"subject": "team", "pool": "p", "resources": {"gpu": 1}, **kw}
