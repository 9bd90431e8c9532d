"""Waiting clients keep a queue lease: while ``allocate`` waits, it heartbeats its queued
request with ``?lease_seconds=<queue_lease>``, so a waiter that is killed (SIGKILL: nothing
runs) loses its queue place within about that lease, and one that lives keeps it. Real server
with its reconciler, real processes and signals."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
from respool_client import AsyncRespool

from support.http import make_request, ok, pool_with_policy
from support.server import Server, running_server

WAITER = textwrap.dedent(
    """
    import sys
    from respool_client import Respool
    with Respool(sys.argv[1], queue_lease=int(sys.argv[2])) as rp:
        with rp.allocate("team", resources={"gpu": 1}):
            print("granted", flush=True)
    """
)


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Server]:
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as srv:
        yield srv


async def _queued(server: Server) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = ok(
        await server.client.get("/v1/requests", params={"status": "queued"})
    )["items"]
    return items


async def _until(check: Any, within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        result = await check()
        if result:
            return result
        await asyncio.sleep(0.05)
    raise AssertionError(f"not true within {within} s: {check}")


async def test_a_killed_waiter_loses_its_place_a_live_one_keeps_it(live: Server) -> None:
    await pool_with_policy(live.client, capacity={"gpu": 1})
    await make_request(live.client, resources={"gpu": 1}, lease_seconds=None)  # holds the GPU
    waiter = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WAITER, live.url, "2", env=os.environ.copy()
    )
    try:
        queued = (await _until(lambda: _queued(live)))[0]
        await asyncio.sleep(4)  # twice the queue lease: the heartbeats keep the place
        assert ok(await live.client.get(f"/v1/requests/{queued['id']}"))["status"] == "queued"
        waiter.send_signal(signal.SIGKILL)
        await waiter.wait()
        killed_at = time.monotonic()

        async def abandoned() -> bool:
            body = ok(await live.client.get(f"/v1/requests/{queued['id']}"))
            return bool((body["status"], body["reason"]) == ("cancelled", "abandoned"))

        await _until(abandoned, within=10)
        assert time.monotonic() - killed_at < 2 + 3  # the queue lease, plus a few passes
    finally:
        if waiter.returncode is None:
            waiter.kill()
            await waiter.wait()


async def test_the_grant_keeps_its_own_lease_after_queue_heartbeats(live: Server) -> None:
    await pool_with_policy(live.client, capacity={"gpu": 1})
    holder = await make_request(live.client, resources={"gpu": 1}, lease_seconds=None)

    async def release_later() -> None:
        await asyncio.sleep(3)
        ok(await live.client.post(f"/v1/requests/{holder['id']}/release"))

    releaser = asyncio.create_task(release_later())
    async with (
        AsyncRespool(live.url, queue_lease=1) as rp,
        rp.allocate("team", resources={"gpu": 1}, lease_seconds=600) as grant,
    ):
        await releaser
        body = ok(await live.client.get(f"/v1/requests/{grant.request_id}"))
        left = datetime.fromisoformat(body["lease_expires_at"]) - datetime.fromisoformat(
            body["updated_at"]
        )
        assert body["status"] == "allocated"
        assert left.total_seconds() > 500  # the request's 600 s lease, not the 1 s queue lease


@pytest.mark.parametrize("lease", [600, None])
async def test_a_queue_heartbeat_that_lands_after_the_grant_keeps_the_allocations_lease(
    live: Server, lease: int | None
) -> None:
    """The race a waiting client cannot rule out: its last queue heartbeat reaches the request
    just after the grant. A queue lease length never applies to an allocation: the request keeps
    its own lease (600 s), or none."""
    await pool_with_policy(live.client, capacity={"gpu": 1})
    async with AsyncRespool(live.url) as rp:
        state = await rp.create_request("team", resources={"gpu": 1}, lease_seconds=lease)
        assert state.status == "allocated"
        late = await rp.heartbeat(state.id, state.attempt, queue_lease_seconds=1)  # the late beat
    assert late.status == "allocated"
    if lease is None:
        assert late.lease_expires_at is None
    else:
        assert late.lease_expires_at is not None
        assert (late.lease_expires_at - late.updated_at).total_seconds() > 500
