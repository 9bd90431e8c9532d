"""A create body is decoded once on its way in (``POST /v1/requests``): strictly, into the
request it describes, from the bytes the client sent; the engine is then given those bytes.
Its OpenAPI description is that of a plain JSON body (tests/api/test_schemathesis.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import litestar.connection.request
import msgspec
import pytest

from support.http import error, ok, pool_with_policy
from support.server import Server

JSON = {"content-type": "application/json"}


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bytes]]]:
    """Every decode of a JSON text in this process: (by whom, the text)."""
    seen: list[tuple[str, bytes]] = []

    def counting(who: str, decode: Any) -> Any:
        def wrapper(text: Any, *args: Any, **kwargs: Any) -> Any:
            raw = bytes(text) if isinstance(text, bytes | bytearray) else str(text).encode()
            seen.append((who, raw))
            return decode(text, *args, **kwargs)

        return wrapper

    request_module: Any = litestar.connection.request
    monkeypatch.setattr(
        request_module, "decode_json", counting("litestar", request_module.decode_json)
    )
    monkeypatch.setattr(msgspec.json, "decode", counting("msgspec", msgspec.json.decode))
    monkeypatch.setattr(json, "loads", counting("json", json.loads))
    yield seen


async def _pool(server: Server) -> None:
    if (await server.client.get("/v1/pools/p")).status_code == 404:
        await pool_with_policy(server.client, capacity={"gpu": 8})


@pytest.mark.parametrize(
    "body",
    [
        {"subject": "team", "pool": "p", "resources": {"gpu": 1}},
        {"subject": "team", "pool": "p", "resources": {"gpu": 1}, "settings": {"cpu_count": 0.5}},
    ],
    ids=["plain", "decimal"],
)
async def test_a_create_body_is_decoded_once(
    module_server: Server, decodes: list[tuple[str, bytes]], body: dict[str, Any]
) -> None:
    await _pool(module_server)
    text = json.dumps(body).encode()
    decodes.clear()
    created = await module_server.client.post("/v1/requests", content=text, headers=JSON)
    assert ok(created, 201)["subject"] == "team"
    assert [who for who, seen in decodes if seen == text] == ["msgspec"], decodes


async def test_a_decimal_sent_as_a_string_is_refused_however_its_key_is_spelled(
    module_server: Server,
) -> None:
    await _pool(module_server)
    for text in (
        b'{"subject": "team", "pool": "p", "settings": {"cpu_count": "1"}}',
        b'{"subject": "team", "pool": "p", "settings": {"cpu_count" :\n "1"}}',
        b'{"subject": "team", "pool": "p", "settings": {"cpu\\u005fcount": "1"}}',
    ):
        refused = await module_server.client.post("/v1/requests", content=text, headers=JSON)
        assert "string" in error(refused, 400, "settings.cpu_count")["detail"]


async def test_a_body_that_is_not_json_gets_the_answer_of_every_other_route(
    module_server: Server,
) -> None:
    await _pool(module_server)
    c = module_server.client
    for text in (b"{not json", b'{"subject": "team",', b"", b"{"):
        create = await c.post("/v1/requests", content=text, headers=JSON)
        pool = await c.post("/v1/pools", content=text, headers=JSON)
        assert error(create, 400) == error(pool, 400), text


async def test_a_create_body_of_the_wrong_shape_is_400(module_server: Server) -> None:
    await _pool(module_server)
    for text in (b"[1, 2]", b"null", b'"team"'):
        error(await module_server.client.post("/v1/requests", content=text, headers=JSON), 400)
