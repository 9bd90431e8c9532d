"""Long-poll: NOTIFY wakes waiters (well under the polling backstop), waits time out with the
current state, waiting holds no DB connection, the listener reconnects, shutdown answers waits."""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import asyncpg
import httpx

from app.api.requests import POLL_BACKSTOP
from support.http import make_request, ok, pool_with_policy
from support.server import Server, waiting_clients


async def _full_pool(server: Server) -> tuple[dict[str, object], dict[str, object]]:
    await pool_with_policy(server.client, capacity={"gpu": 1})
    holder = await make_request(server.client, resources={"gpu": 1})
    waiting = await make_request(server.client, resources={"gpu": 1})
    assert (holder["status"], waiting["status"]) == ("allocated", "queued")
    return holder, waiting


async def _open_waits(
    server: Server, request_id: object, n: int, *, wait: int
) -> list[asyncio.Task[httpx.Response]]:
    """``n`` long polls (``wait`` seconds) on one request, returned once all ``n`` are waiting."""
    tasks = [
        asyncio.create_task(server.client.get(f"/v1/requests/{request_id}", params={"wait": wait}))
        for _ in range(n)
    ]
    await waiting_clients(server, n)
    return tasks


async def _release_and_time_wake(
    server: Server, holder_id: object, waiter: asyncio.Task[object]
) -> float:
    ok(await server.client.post(f"/v1/requests/{holder_id}/release"))
    released = time.monotonic()
    await asyncio.wait_for(waiter, 5)
    return time.monotonic() - released


async def test_get_wait_is_woken_by_notify(server: Server) -> None:
    c = server.client
    holder, waiting = await _full_pool(server)
    start = time.monotonic()
    task = asyncio.create_task(c.get(f"/v1/requests/{waiting['id']}", params={"wait": 10}))
    await waiting_clients(server, 1)
    await asyncio.sleep(0.3)
    assert not task.done()
    latency = await _release_and_time_wake(server, holder["id"], task)  # type: ignore[arg-type]
    got = ok(task.result())
    assert got["status"] == "allocated" and got["version"] > waiting["version"]  # type: ignore[operator]
    assert latency < 1.0 < POLL_BACKSTOP, latency  # NOTIFY woke it, not the backstop
    assert time.monotonic() - start < 5
    print(
        f"\n[wake latency] release response -> waiter response: {latency * 1000:.1f} ms",
        file=sys.stderr,
    )


async def test_get_wait_times_out_with_current_state(server: Server) -> None:
    c = server.client
    _, waiting = await _full_pool(server)
    start = time.monotonic()
    got = ok(await c.get(f"/v1/requests/{waiting['id']}", params={"wait": 1}))
    elapsed = time.monotonic() - start
    assert got["status"] == "queued" and got["version"] == waiting["version"]
    assert 0.9 <= elapsed < 2.5, elapsed
    # A version other than the current one answers at once.
    start = time.monotonic()
    got = ok(await c.get(f"/v1/requests/{waiting['id']}", params={"wait": 10, "version": 0}))
    assert time.monotonic() - start < 0.5 and got["version"] == waiting["version"]


async def test_post_wait_on_a_full_pool_answers_queued_after_the_wait(server: Server) -> None:
    c = server.client
    await _full_pool(server)
    start = time.monotonic()
    r = await c.post(
        "/v1/requests", params={"wait": 1}, json={"subject": "team", "resources": {"gpu": 1}}
    )
    elapsed = time.monotonic() - start
    assert r.status_code == 201 and r.json()["status"] == "queued"
    assert 0.9 <= elapsed < 2.5, elapsed


async def test_post_wait_returns_when_granted(server: Server) -> None:
    c = server.client
    holder, _ = await _full_pool(server)  # one already queued ahead of ours
    ok(await c.post(f"/v1/requests/{holder['id']}/release"))  # the first waiter gets it
    task = asyncio.create_task(
        c.post(
            "/v1/requests",
            params={"wait": 10},
            json={"subject": "team", "resources": {"gpu": 1}, "idempotency_key": "w"},
        )
    )
    await waiting_clients(server, 1)
    listed = ok(await c.get("/v1/requests", params={"status": "allocated"}))["items"]
    assert len(listed) == 1
    latency = await _release_and_time_wake(server, listed[0]["id"], task)  # type: ignore[arg-type]
    r = task.result()
    assert r.status_code == 201 and r.json()["status"] == "allocated"  # type: ignore[attr-defined]
    assert latency < 1.0, latency
    # Immediately granted: no waiting at all.
    again = await c.post(
        "/v1/requests",
        params={"wait": 10},
        json={"subject": "team", "resources": {"gpu": 1}, "idempotency_key": "w"},
    )
    assert again.status_code == 200 and again.json()["status"] == "allocated"


async def test_waiting_holds_no_db_connection(server: Server) -> None:
    c = server.client  # the server's pool has 4 connections
    _, waiting = await _full_pool(server)
    tasks = await _open_waits(server, waiting["id"], 12, wait=3)
    start = time.monotonic()
    ok(await c.get("/v1/pools"))
    assert time.monotonic() - start < 1.0
    ok(await c.post(f"/v1/requests/{waiting['id']}/cancel"))
    done = await asyncio.wait_for(asyncio.gather(*tasks), 3)
    assert {r.json()["status"] for r in done} == {"cancelled"}


async def test_listener_reconnects_and_still_wakes(server: Server) -> None:
    c = server.client
    holder, waiting = await _full_pool(server)
    task = asyncio.create_task(c.get(f"/v1/requests/{waiting['id']}", params={"wait": 10}))
    await waiting_clients(server, 1)

    conn = await asyncpg.connect(server.db_url)
    try:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'respool-listener' AND datname = current_database()"
        )
    finally:
        await conn.close()
    assert killed == 1
    for _ in range(300):
        if server.notifier.reconnects >= 1 and server.notifier.healthy:
            break
        await asyncio.sleep(0.01)
    assert server.notifier.reconnects >= 1 and server.notifier.healthy
    assert not task.done()  # woken to re-read, nothing changed: still waiting

    latency = await _release_and_time_wake(server, holder["id"], task)  # type: ignore[arg-type]
    assert ok(task.result())["status"] == "allocated"
    assert latency < 1.0, latency
    assert ok(await c.get("/readyz"))["listener"] is True


async def test_sigterm_answers_open_waits(server: Server) -> None:
    _, waiting = await _full_pool(server)
    tasks = await _open_waits(server, waiting["id"], 3, wait=10)
    start = time.monotonic()
    server.uvicorn.handle_exit(signal.SIGTERM, None)
    done = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert time.monotonic() - start < 2.0
    assert [r.status_code for r in done] == [200, 200, 200]
    assert {r.json()["status"] for r in done} == {"queued"}
