"""What the client sends as a create body, checked through a real server: ``lease_seconds``
left out is the server's default lease, ``lease_seconds=None`` is no lease (an explicit null on
the wire), and a misspelt field is an error, not silently dropped."""

from __future__ import annotations

import asyncio

import pytest
from respool_client import AsyncRespool, Respool

from support.http import ok, pool_with_policy
from support.server import Server


async def _raw(server: Server, request_id: object) -> dict[str, object]:
    body: dict[str, object] = ok(await server.client.get(f"/v1/requests/{request_id}"))
    return body


async def _server_default_lease(server: Server) -> object:
    body = {"subject": "team", "resources": {"gpu": 1}}
    created = ok(await server.client.post("/v1/requests", json=body), 201)
    ok(await server.client.post(f"/v1/requests/{created['id']}/release"))
    return created["lease_seconds"]


async def test_lease_none_is_no_lease_and_omitted_is_the_server_default(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 8})
    default = await _server_default_lease(server)
    assert isinstance(default, int) and default > 0
    async with AsyncRespool(server.url) as rp:
        none = await rp.create_request("team", resources={"gpu": 1}, lease_seconds=None)
        omitted = await rp.create_request("team", resources={"gpu": 1})
        given = await rp.create_request("team", resources={"gpu": 1}, lease_seconds=77)
        async with rp.allocate("team", resources={"gpu": 1}, lease_seconds=None) as grant:
            held = await _raw(server, grant.request_id)
    assert (await _raw(server, none.id))["lease_seconds"] is None
    assert (await _raw(server, none.id))["lease_expires_at"] is None
    assert (await _raw(server, omitted.id))["lease_seconds"] == default
    assert (await _raw(server, given.id))["lease_seconds"] == 77
    assert held["lease_seconds"] is None and held["status"] == "allocated"


async def test_sync_client_lease_none_is_no_lease(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 8})
    default = await _server_default_lease(server)

    def step() -> tuple[object, object, object]:
        with Respool(server.url) as rp:
            none = rp.create_request("team", resources={"gpu": 1}, lease_seconds=None)
            omitted = rp.create_request("team", resources={"gpu": 1})
            with rp.allocate("team", resources={"gpu": 1}, lease_seconds=None) as grant:
                return none.id, omitted.id, grant.lease_seconds

    none_id, omitted_id, grant_lease = await asyncio.to_thread(step)
    assert (await _raw(server, none_id))["lease_seconds"] is None
    assert (await _raw(server, omitted_id))["lease_seconds"] == default
    assert grant_lease is None


async def test_a_misspelt_field_is_an_error_and_creates_nothing(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 8})
    async with AsyncRespool(server.url) as rp:
        with pytest.raises(TypeError, match="lease"):
            await rp.create_request("team", resources={"gpu": 1}, lease=60)
        with pytest.raises(TypeError, match="resource"):
            async with rp.allocate("team", resource={"gpu": 1}):
                pass
    assert ok(await server.client.get("/v1/requests"))["items"] == []
