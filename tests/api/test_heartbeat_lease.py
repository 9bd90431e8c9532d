"""Heartbeats (docs/api.md): ``POST /v1/requests/{id}/heartbeat?lease_seconds=N``, queue leases."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from support.http import error, make_request, ok, one_gpu_request, pool_with_policy
from support.server import Server, running_server


@pytest.fixture
async def reconciled(db_url: str) -> AsyncIterator[Server]:
    """A server whose reconciler passes every 0.2 s."""
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as srv:
        yield srv


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_lease_seconds_sets_the_lease_of_an_allocated_request(server: Server) -> None:
    c = server.client
    req = await one_gpu_request(c, lease_seconds=300)
    rid = req["id"]
    long = ok(await c.post(f"/v1/requests/{rid}/heartbeat", params={"lease_seconds": 3600}))
    assert _at(long["lease_expires_at"]) - _at(long["updated_at"]) == timedelta(seconds=3600)
    short = ok(
        await c.post(f"/v1/requests/{rid}/heartbeat", params={"lease_seconds": 40, "attempt": 1})
    )
    assert _at(short["lease_expires_at"]) - _at(short["updated_at"]) == timedelta(seconds=40)
    default = ok(await c.post(f"/v1/requests/{rid}/heartbeat"))
    assert _at(default["lease_expires_at"]) - _at(default["updated_at"]) == timedelta(seconds=300)
    assert default["lease_seconds"] == 300 and default["status"] == "allocated"


@pytest.mark.parametrize("bad", ["0", "-5", "31536001", "ten", "1.5"])
async def test_bad_lease_seconds_is_a_400_naming_it(server: Server, bad: str) -> None:
    c = server.client
    req = await one_gpu_request(c)
    body = error(
        await c.post(f"/v1/requests/{req['id']}/heartbeat", params={"lease_seconds": bad}),
        400,
        "lease_seconds",
    )
    assert "lease_seconds" in body["detail"]
    after = ok(await c.get(f"/v1/requests/{req['id']}"))
    assert after["lease_expires_at"] == req["lease_expires_at"]


async def test_queued_request_whose_client_stops_heartbeating_is_abandoned(
    reconciled: Server,
) -> None:
    c = reconciled.client
    await pool_with_policy(c, capacity={"gpu": 1})
    await make_request(c, resources={"gpu": 1}, lease_seconds=None)
    silent = await make_request(c, resources={"gpu": 1})  # never heartbeated: keeps waiting
    dying = await make_request(c, resources={"gpu": 1})
    beat = ok(await c.post(f"/v1/requests/{dying['id']}/heartbeat", params={"lease_seconds": 1}))
    assert beat["status"] == "queued" and beat["queue_position"] == 2

    deadline = time.monotonic() + 15
    state = beat
    while state["status"] == "queued" and time.monotonic() < deadline:
        state = ok(
            await c.get(
                f"/v1/requests/{dying['id']}", params={"wait": 5, "version": state["version"]}
            )
        )
    assert (state["status"], state["reason"]) == ("cancelled", "abandoned")
    events = ok(await c.get(f"/v1/requests/{dying['id']}/events"))
    assert (events[-1]["from"], events[-1]["to"], events[-1]["reason"]) == (
        "queued",
        "cancelled",
        "abandoned",
    )
    still = ok(await c.get(f"/v1/requests/{silent['id']}"))
    assert (still["status"], still["queue_position"]) == ("queued", 1)


async def test_a_waiting_client_that_keeps_heartbeating_keeps_its_place(
    reconciled: Server,
) -> None:
    c = reconciled.client
    holder = await one_gpu_request(c, lease_seconds=None)
    waiter = await make_request(c, resources={"gpu": 1})
    for _ in range(6):  # 3 s of heartbeats with a 2 s queue lease: > 10 reconciler passes
        beat = ok(
            await c.post(f"/v1/requests/{waiter['id']}/heartbeat", params={"lease_seconds": 2})
        )
        assert beat["status"] == "queued"
        await asyncio.sleep(0.5)
    ok(await c.post(f"/v1/requests/{holder['id']}/release"))
    granted = ok(await c.get(f"/v1/requests/{waiter['id']}"))
    assert granted["status"] == "allocated"
