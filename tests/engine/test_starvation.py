"""The starvation guard (docs/scheduling.md) with EASY backfill, and max_seconds runtime caps.

Time is the test's own clock: every create, release and reconcile passes an explicit ``p_now``
(the engine's functions take one), so "waited starvation_seconds" is exact and nothing sleeps.
The clock starts two hours in the past, so a read at the real ``now()`` (a request's message)
sees every hold the test's clock has started.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import engine_support as es
import pytest

from app.db import pools as db_pools
from app.db import requests as db_requests
from app.db.errors import BadInput


async def create(
    conn: asyncpg.Connection, subject: str, gpu: int, at: datetime, max_seconds: int | None = None
) -> UUID:
    doc = await es.create_at(conn, subject, "p", {"gpu": gpu}, at, max_seconds=max_seconds)
    return UUID(doc["id"])


async def setup(conn: asyncpg.Connection, starvation: int | None) -> None:
    await es.mk_pool(conn, "p", {"gpu": 8}, starvation_seconds=starvation)
    await es.mk_policy(conn, "big", "p")
    await es.mk_policy(conn, "small", "p")


@pytest.mark.parametrize("guard", ["on", "off"])
async def test_stream_of_small_requests_starves_the_big_one_only_without_the_guard(
    conn: asyncpg.Connection, guard: str
) -> None:
    hold = 60
    await setup(conn, hold if guard == "on" else None)
    t0 = await es.db_now(conn) - timedelta(hours=2)
    # 8 one-GPU steps keep the pool busy; every 10 s the oldest ends and a new one asks.
    running = [await create(conn, "small", 1, t0 + timedelta(seconds=i)) for i in range(8)]
    for r in running:
        assert (await es.get(conn, r)).status == "allocated"
    big_queued_at = t0 + timedelta(seconds=9)
    big = await create(conn, "big", 8, big_queued_at)
    assert (await es.get(conn, big)).status == "queued"
    granted_at: datetime | None = None
    stolen_during_hold: list[UUID] = []
    now = big_queued_at
    for step in range(30):
        now = big_queued_at + timedelta(seconds=10 * (step + 1))
        await es.release_at(conn, running.pop(0), now)
        if granted_at is None and (await es.get(conn, big)).status == "allocated":
            granted_at = now
        new = await create(conn, "small", 1, now + timedelta(milliseconds=1))
        if (await es.get(conn, new)).status == "allocated":
            running.append(new)
            if granted_at is None and now - big_queued_at >= timedelta(seconds=hold):
                stolen_during_hold.append(new)
        else:
            if granted_at is not None:
                running.append(new)  # queued behind the big one's grant; still a holder later
            else:
                message = (await es.get(conn, new)).message
                assert message.startswith("held: pool reserves gpu for an earlier request")
                held_for = "SELECT held_for FROM respool.queue WHERE request_id = $1"
                assert await conn.fetchval(held_for, new) == big
        if granted_at is not None:
            break
    if guard == "off":
        assert granted_at is None, "without the guard the stream keeps every freed unit"
        assert (await es.get(conn, big)).status == "queued"
    else:
        assert granted_at is not None
        assert stolen_during_hold == []
        # one hold period plus the longest holder's runtime (8 holders ending 10 s apart)
        assert granted_at - big_queued_at <= timedelta(seconds=hold + 80)
    await es.assert_healthy(conn)


async def test_backfill_needs_max_seconds_ending_before_the_shadow_time(
    conn: asyncpg.Connection,
) -> None:
    await setup(conn, 0)  # the head is held for at once
    t0 = await es.db_now(conn) - timedelta(hours=2)
    capped = await create(conn, "small", 4, t0, max_seconds=600)  # ends by t0 + 600 at the latest
    await create(conn, "small", 2, t0)  # no cap: counted as never ending
    head = await create(conn, "big", 6, t0 + timedelta(seconds=1))  # fits once `capped` ends
    assert (await es.get(conn, head)).status == "queued"
    at = t0 + timedelta(seconds=2)
    short = await create(conn, "small", 1, at, max_seconds=60)
    uncapped = await create(conn, "small", 1, at)
    too_long = await create(conn, "small", 1, at, max_seconds=900)
    assert (await es.get(conn, short)).status == "allocated"
    for held in (uncapped, too_long):
        got = await es.get(conn, held)
        assert got.status == "queued"
        # (the head is respool.queue's held_for, below: the message does not name it)
        assert got.message.startswith("held: pool reserves gpu for an earlier request (waiting ")
    rows = await conn.fetch(
        "SELECT request_id, held_for, held_message FROM respool.queue WHERE pool = 'p'"
    )
    assert {r["request_id"]: r["held_for"] for r in rows} == {
        head: head,
        uncapped: head,
        too_long: head,
    }
    assert [r["held_message"] is None for r in rows if r["request_id"] == head] == [True]
    # The backfilled step runs out at its cap, heartbeats or not; the hold still keeps the unit.
    await db_requests.heartbeat_request(conn, short)
    await es.reconcile(conn, "p", at + timedelta(seconds=61))
    got = await es.get(conn, short)
    assert (got.status, got.reason) == ("expired", "max_seconds")
    assert (await es.events(conn, short))[-1] == ("allocated", "expired", "max_seconds")
    assert (await es.get(conn, uncapped)).status == "queued"
    # At the shadow time the capped holder ends, and the head is granted before anyone else.
    await es.reconcile(conn, "p", t0 + timedelta(seconds=601))
    assert (await es.get(conn, capped)).reason == "max_seconds"
    assert (await es.get(conn, head)).status == "allocated"
    assert (await es.get(conn, uncapped)).status == "queued"  # 2 + 6 = 8: full
    await es.assert_healthy(conn)


async def test_a_request_leaving_the_head_its_units_is_granted_during_a_hold(
    conn: asyncpg.Connection,
) -> None:
    await es.mk_pool(conn, "p", {"gpu": 8, "tpu": 4}, starvation_seconds=0)
    await es.mk_policy(conn, "big", "p")
    await es.mk_policy(conn, "small", "p")
    t0 = await es.db_now(conn) - timedelta(hours=2)
    await create(conn, "small", 6, t0)
    head = await create(conn, "big", 4, t0 + timedelta(seconds=1))  # 2 free: waits, held for
    tpu_only = await es.mk_req(conn, "small", "p", resources={"tpu": 2})
    assert (await es.get(conn, tpu_only.id)).status == "allocated"  # takes nothing the head needs
    assert (await es.get(conn, head)).status == "queued"


async def test_the_guard_never_applies_to_strict_pools_and_default_is_300(
    conn: asyncpg.Connection,
) -> None:
    pool = await es.mk_pool(conn, "p", {"gpu": 8})
    assert (pool.starvation_seconds, pool.ordering) == (300, "fifo")
    off = await db_pools.update_pool(conn, "p", starvation_off=True, ordering="fair")
    assert (off.starvation_seconds, off.ordering) == (None, "fair")
    back = await db_pools.update_pool(conn, "p", starvation_seconds=5)
    assert (back.starvation_seconds, back.ordering) == (5, "fair")


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("starvation_seconds", {"starvation_seconds": -1}),
        ("ordering", {"ordering": "lottery"}),
    ],
)
async def test_bad_pool_fields_name_the_field(
    conn: asyncpg.Connection, field: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(BadInput) as err:
        await es.mk_pool(conn, "p", {"gpu": 1}, **kwargs)
    assert err.value.field == field


async def test_max_seconds_must_be_positive(conn: asyncpg.Connection) -> None:
    await setup(conn, None)
    with pytest.raises(BadInput) as err:
        await db_requests.create_request(
            conn, {"subject": "small", "pool": "p", "resources": {"gpu": 1}, "max_seconds": 0}
        )
    assert err.value.field == "max_seconds"
    made = await db_requests.create_request(
        conn, {"subject": "small", "pool": "p", "resources": {"gpu": 1}, "max_seconds": 30}
    )
    assert (made.request.max_seconds, made.request.run_deadline is not None) == (30, True)
