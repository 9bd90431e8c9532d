"""The Python client (docs/client.md) against a real server and database: allocate/release,
rejection, queueing, timeout, preemption signal, a server restart mid-wait, transient-error
retries, and the async twin. The sync client blocks, so the tests run it in a worker thread (the
server runs in the test's event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest
from respool_client import (
    AllocationTimeout,
    ApiError,
    AsyncRespool,
    Grant,
    Preempted,
    Rejected,
    ResourceSettings,
    Respool,
    RespoolError,
)

from support.http import make_request, ok, one_gpu_request, pool_with_policy
from support.ports import free_port
from support.server import Server, running_server
from support.wait import wait_until


async def _usage(server: Server, pool: str = "p") -> dict[str, int]:
    body = ok(await server.client.get(f"/v1/pools/{pool}"))
    return {k: v for k, v in body["usage"].items() if v}


async def _status(server: Server, request_id: object) -> str:
    status: str = ok(await server.client.get(f"/v1/requests/{request_id}"))["status"]
    return status


async def _one_request(server: Server, **filters: str) -> dict[str, Any]:
    items = ok(await server.client.get("/v1/requests", params=filters))["items"]
    assert len(items) == 1, items
    result: dict[str, Any] = items[0]
    return result


# --- sync client -------------------------------------------------------------------------------


async def test_allocate_and_release(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 8, "mcpu": 8000})

    def step() -> tuple[Grant, str]:
        with (
            Respool(server.url) as rp,
            rp.allocate(
                "team",
                settings=ResourceSettings(gpu_count=3, cpu_count="0.25"),
                labels={"job": "x"},
            ) as grant,
        ):
            inside = rp.get_request(grant.request_id).status
        return grant, inside

    grant, inside = await asyncio.to_thread(step)
    assert inside == "allocated"
    assert grant.pool == "p" and grant.attempt == 1 and not grant.preempted
    assert grant.resources["gpu"] == 3 and grant.resources["mcpu"] == 250
    assert await _status(server, grant.request_id) == "released"
    assert await _usage(server) == {}


async def test_released_when_the_body_raises(server: Server) -> None:
    await pool_with_policy(server.client)
    seen: list[Grant] = []

    def step() -> None:
        with Respool(server.url) as rp, rp.allocate("team", resources={"gpu": 2}) as grant:
            seen.append(grant)
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await asyncio.to_thread(step)
    assert await _status(server, seen[0].request_id) == "released"
    assert await _usage(server) == {}


async def test_rejected_carries_the_reason(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 2})

    def step() -> None:
        with Respool(server.url) as rp, rp.allocate("team", resources={"gpu": 3}):
            raise AssertionError("not reached")

    with pytest.raises(Rejected) as info:
        await asyncio.to_thread(step)
    assert info.value.reason == "exceeds_capacity"
    assert isinstance(info.value, RespoolError)


async def test_queued_then_granted_after_release(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 1})
    holder = await make_request(server.client, resources={"gpu": 1})
    got: list[Grant] = []

    def step() -> None:
        with Respool(server.url) as rp, rp.allocate("team", resources={"gpu": 1}) as grant:
            got.append(grant)

    task = asyncio.create_task(asyncio.to_thread(step))

    async def queued() -> bool:
        return ok(await server.client.get("/v1/pools/p"))["queued"] == 1

    await wait_until(queued, "the request queued", within=5)
    await asyncio.sleep(0.2)
    assert not task.done()
    ok(await server.client.post(f"/v1/requests/{holder['id']}/release"))
    await asyncio.wait_for(task, 5)
    assert got and got[0].resources["gpu"] == 1
    assert await _usage(server) == {}


async def test_timeout_cancels_the_request(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 1})
    await make_request(server.client, resources={"gpu": 1}, labels={"role": "holder"})

    def step() -> None:
        with (
            Respool(server.url) as rp,
            rp.allocate("team", resources={"gpu": 1}, labels={"role": "w"}, timeout=0.5),
        ):
            raise AssertionError("not reached")

    with pytest.raises(AllocationTimeout) as info:
        await asyncio.to_thread(step)
    assert info.value.waited >= 0.5
    assert "waiting for gpu" in info.value.message
    assert await _status(server, info.value.request_id) == "cancelled"
    assert ok(await server.client.get("/v1/pools/p"))["queued"] == 0


async def test_cancel_from_outside_signals_preemption(server: Server) -> None:
    await pool_with_policy(server.client)
    fired = threading.Event()
    calls: list[Grant] = []

    def on_preempted(grant: Grant) -> None:
        calls.append(grant)
        fired.set()

    def step(rid: list[str], ready: threading.Event) -> Grant:
        with (
            Respool(server.url) as rp,
            rp.allocate(
                "team", resources={"gpu": 1}, heartbeat_interval=0.1, on_preempted=on_preempted
            ) as grant,
        ):
            rid.append(str(grant.request_id))
            ready.set()
            assert fired.wait(5), "on_preempted did not fire"
            assert grant.preempted
            with pytest.raises(Preempted):
                grant.raise_if_preempted()
        return grant

    rid: list[str] = []
    ready = threading.Event()
    task = asyncio.create_task(asyncio.to_thread(step, rid, ready))
    assert await asyncio.to_thread(ready.wait, 5)
    ok(await server.client.post(f"/v1/requests/{rid[0]}/cancel"))
    grant = await asyncio.wait_for(task, 10)
    assert calls == [grant] and grant.status == "cancelled"
    assert await _usage(server) == {}


async def test_reclaim_with_a_grace_period_signals_preemption_async(server: Server) -> None:
    """The reconciler preempts the step (prod reclaims its reserved GPU): the heartbeat tells
    the client, the callback fires, and leaving the block releases the units to prod."""
    await pool_with_policy(server.client, capacity={"gpu": 1})
    ok(await server.client.patch("/v1/pools/p", json={"preemption_grace_seconds": 30}))
    ok(
        await server.client.post(
            "/v1/policies", json={"subject": "prod", "pool": "p", "reserved": {"gpu": 1}}
        ),
        201,
    )
    fired = asyncio.Event()

    async def on_preempted(grant: Grant) -> None:
        fired.set()

    async with (
        AsyncRespool(server.url) as rp,
        rp.allocate(
            "team", resources={"gpu": 1}, heartbeat_interval=0.1, on_preempted=on_preempted
        ) as grant,
    ):
        prod = ok(
            await server.client.post(
                "/v1/requests", json={"subject": "prod", "resources": {"gpu": 1}}
            ),
            201,
        )
        conn = await asyncpg.connect(server.db_url)
        try:
            await conn.execute(
                "SELECT respool.reconcile_pool(id) FROM respool.pools WHERE name = 'p'"
            )
        finally:
            await conn.close()
        await asyncio.wait_for(fired.wait(), 5)
        assert grant.preempted and grant.status == "preempting"
        assert grant.reason == "reclaim"
        assert await _status(server, prod["id"]) == "queued"  # the units are earmarked for it
    # Released while preempting: it ends preempted, and its units go to prod at once.
    assert await _status(server, grant.request_id) == "preempted"
    assert await _status(server, prod["id"]) == "allocated"


# --- async twin ----------------------------------------------------------------------------------


async def test_async_allocate_and_release(server: Server) -> None:
    await pool_with_policy(server.client)
    async with AsyncRespool(server.url) as rp:
        async with rp.allocate("team", resources={"gpu": 4}, lease_seconds=30) as grant:
            assert grant.lease_seconds == 30
            assert (await _usage(server))["gpu"] == 4
        assert await _usage(server) == {}
        with pytest.raises(ValueError, match="boom"):
            async with rp.allocate("team", resources={"gpu": 4}):
                raise ValueError("boom")
        assert await _usage(server) == {}
        with pytest.raises(Rejected) as info:
            async with rp.allocate("team", resources={"gpu": 9}):
                raise AssertionError("not reached")
        assert info.value.reason == "exceeds_capacity"


async def test_error_answers_are_typed(server: Server) -> None:
    async with AsyncRespool(server.url) as rp:
        with pytest.raises(ApiError) as info:
            await rp.get_request("00000000-0000-0000-0000-000000000000")
    assert info.value.status_code == 404 and info.value.field == "id" and info.value.detail


# --- wire format, retries, restarts ------------------------------------------------------------


async def test_sends_the_bearer_token_and_the_settings_as_written() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(401, json={"status_code": 401, "detail": "bad token"})

    rp = AsyncRespool(
        "http://respool.invalid/", token="s3cret", transport=httpx.MockTransport(answer)
    )
    async with rp:
        with pytest.raises(ApiError) as info:
            await rp.create_request("team", settings=ResourceSettings(cpu_count="0.125"))
    assert (info.value.status_code, info.value.detail, info.value.field) == (401, "bad token", None)
    assert len(seen) == 1  # a 4xx is not retried
    assert seen[0].headers["authorization"] == "Bearer s3cret"
    assert seen[0].url.path == "/v1/requests"
    assert b'"settings":{"cpu_count":0.125}' in seen[0].content


def test_cpu_count_keeps_its_decimal_text() -> None:
    enc = msgspec.json.Encoder(decimal_format="number")
    for given, text in [("0.25", b"0.25"), (Decimal("1.50"), b"1.50"), (0.1, b"0.1"), (2, b"2")]:
        body = ResourceSettings(cpu_count=given, memory="2GB").to_json()
        assert enc.encode(body) == b'{"cpu_count":' + text + b',"memory":"2GB"}'
    with pytest.raises(ValueError):
        ResourceSettings(cpu_count="lots")


async def test_retries_transient_answers_with_the_same_idempotency_key(server: Server) -> None:
    """502/503/504 and dropped connections are retried; the create is not duplicated."""
    await pool_with_policy(server.client)
    failures = iter(["503", "connect", "502"])
    keys: list[bytes] = []

    class Flaky(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "POST" and request.url.path == "/v1/requests":
                keys.append(msgspec.json.decode(await request.aread())["idempotency_key"])
                mode = next(failures, None)
                if mode == "connect":
                    raise httpx.ConnectError("refused", request=request)
                if mode is not None:
                    # The first failure reaches the server; the answer is lost on the way back.
                    if mode == "503":
                        await self.inner.handle_async_request(request)
                    return httpx.Response(int(mode), json={"status_code": int(mode)})
            return await self.inner.handle_async_request(request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    async with (
        AsyncRespool(server.url, transport=Flaky(), backoff_base=0.01) as rp,
        rp.allocate("team", resources={"gpu": 1}) as grant,
    ):
        assert len(keys) == 4 and len(set(keys)) == 1
        assert (await _one_request(server))["id"] == str(grant.request_id)
    assert await _usage(server) == {}


@contextlib.asynccontextmanager
async def _serve_on(db_url: str, port: int) -> AsyncIterator[str]:
    """The API on a given loopback port (to restart a server in place): its URL."""
    async with running_server(db_url, port=port) as server:
        yield server.url


@pytest.mark.slow
async def test_server_restart_mid_wait(db_url: str) -> None:
    """The server goes away while the client long-polls; a new one on the same port and DB
    comes up after a while; the client gets its allocation."""
    port = free_port()
    got: list[Grant] = []

    def step(url: str) -> None:
        with (
            Respool(url, backoff_base=0.05, backoff_max=0.3) as rp,
            rp.allocate("team", resources={"gpu": 1}, timeout=15) as grant,
        ):
            got.append(grant)

    async with _serve_on(db_url, port) as url, httpx.AsyncClient(base_url=url) as c:
        holder = await one_gpu_request(c)
        task = asyncio.create_task(asyncio.to_thread(step, url))

        async def queued() -> bool:
            return bool(ok(await c.get("/v1/pools/p"))["queued"] == 1)

        await wait_until(queued, "the request queued", within=5)
        await asyncio.sleep(0.2)  # the client is in its long-poll now
    # Server down: the open wait was answered; the client's next polls are refused.
    await asyncio.sleep(0.7)
    assert not task.done()
    async with _serve_on(db_url, port) as url, httpx.AsyncClient(base_url=url) as c:
        ok(await c.post(f"/v1/requests/{holder['id']}/release"))
        await asyncio.wait_for(task, 10)
        assert got and got[0].resources["gpu"] == 1
        assert ok(await c.get(f"/v1/requests/{got[0].request_id}"))["status"] == "released"


async def test_server_that_starts_late(db_url: str) -> None:
    """Connection refused at first: the create is retried until the server answers."""
    port = free_port()
    async with _serve_on(db_url, port) as url, httpx.AsyncClient(base_url=url) as c:
        await pool_with_policy(c)
    async with AsyncRespool(url, backoff_base=0.05, backoff_max=0.3) as rp:
        attempt = asyncio.create_task(rp.create_request("team", resources={"gpu": 1}))
        await asyncio.sleep(0.5)
        assert not attempt.done()
        async with _serve_on(db_url, port):
            created = await asyncio.wait_for(attempt, 10)
            assert created.status == "allocated"
            await rp.release(created.id, created.attempt)
