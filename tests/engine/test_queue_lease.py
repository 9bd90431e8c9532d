"""Heartbeat (docs/api.md): ``lease_seconds`` per heartbeat, and queue leases on queued requests.

A heartbeat with ``lease_seconds=N`` extends an allocated request's lease to now + N (default: the
request's ``lease_seconds``). On a queued request it sets a queue lease (now + N); a queued request
whose queue lease lapses is ``cancelled`` with reason ``abandoned`` (the reconciler's step 1); a
queued request never heartbeated keeps waiting.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

import asyncpg
import pytest
from engine_support import (
    assert_healthy,
    db_now,
    events,
    get,
    heartbeat_at,
    mk_policy,
    mk_pool,
    mk_pool_s,
    mk_req,
    queue_ids,
    reconcile,
    status,
)

from app.db import requests as db_requests
from app.db.errors import BadInput, Conflict

S = timedelta(seconds=1)


Full = tuple[asyncpg.Connection, UUID, UUID, datetime]


@pytest.fixture
async def full(conn: asyncpg.Connection) -> Full:
    """Pool p (1 GPU, strict) with one holder and one queued request of subject S, and a time
    ``t`` just after they were made (the tests' clock starts there)."""
    await mk_pool_s(conn, {"gpu": 1}, queueing="strict")
    holder = await mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=300)
    waiter = await mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=300)
    assert (holder.status, waiter.status) == ("allocated", "queued")
    return conn, holder.id, waiter.id, await db_now(conn) + S


async def test_heartbeat_sets_the_lease_to_now_plus_the_given_seconds(full: Full) -> None:
    conn, holder, _, _ = full
    t = await db_now(conn) + 5 * S
    got = await heartbeat_at(conn, holder, t, lease_seconds=3600)
    assert got.lease_expires_at == t + 3600 * S
    assert got.lease_seconds == 300  # the request's default is not changed
    shorter = await heartbeat_at(conn, holder, t + S, lease_seconds=40)
    assert shorter.lease_expires_at == t + 41 * S  # absolute: a shorter lease shortens it
    default = await heartbeat_at(conn, holder, t + 2 * S)
    assert default.lease_expires_at == t + 302 * S


async def test_heartbeat_gives_a_lease_to_a_request_without_one(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 1})
    r = await mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=None)
    t = await db_now(conn) + S
    assert (await heartbeat_at(conn, r.id, t)).lease_expires_at is None
    leased = await heartbeat_at(conn, r.id, t, lease_seconds=60)
    assert leased.lease_expires_at == t + 60 * S
    await reconcile(conn, "p", t + 61 * S)
    assert (await get(conn, r.id)).reason == "lease_expired"


@pytest.mark.parametrize("bad", [0, -1, 31_536_001])
async def test_bad_lease_seconds_is_refused_naming_the_field(full: Full, bad: int) -> None:
    conn, holder, waiter, _ = full
    for rid in (holder, waiter):
        before = await get(conn, rid)
        with pytest.raises(BadInput) as info:
            await heartbeat_at(conn, rid, await db_now(conn), lease_seconds=bad)
        assert info.value.field == "lease_seconds"
        assert await get(conn, rid) == before
    assert await conn.fetchval("SELECT count(*) FROM respool.queue_leases") == 0


async def test_queued_request_never_heartbeated_keeps_waiting(full: Full) -> None:
    conn, holder, waiter, _ = full
    await heartbeat_at(conn, holder, await db_now(conn), lease_seconds=10_000_000)
    await reconcile(conn, "p", await db_now(conn) + timedelta(days=30))
    assert await status(conn, waiter) == "queued"


async def test_lapsed_queue_lease_cancels_as_abandoned_and_the_queue_moves(full: Full) -> None:
    conn, holder, waiter, t = full
    behind = (await mk_req(conn, "S", "p", resources={"gpu": 1})).id
    await heartbeat_at(conn, holder, t, lease_seconds=3600)
    queued = await heartbeat_at(conn, waiter, t, lease_seconds=10)
    assert queued.status == "queued"  # a heartbeat never changes a waiting request's status

    await reconcile(conn, "p", t + 9 * S)
    assert await status(conn, waiter) == "queued"
    assert await queue_ids(conn, "p") == [waiter, behind]

    summary = await reconcile(conn, "p", t + 10 * S)
    gone = await get(conn, waiter)
    assert (gone.status, gone.reason) == ("cancelled", "abandoned")
    assert gone.finished_at == t + 10 * S and gone.queue_position is None
    assert (await events(conn, waiter))[-1] == ("queued", "cancelled", "abandoned")
    assert summary["expired"] == 1
    assert await queue_ids(conn, "p") == [behind]  # the strict queue's new head waits its turn
    await db_requests.release_request(conn, holder)
    assert await status(conn, behind) == "allocated"
    assert await conn.fetchval("SELECT count(*) FROM respool.queue_leases") == 0
    await assert_healthy(conn)


async def test_each_heartbeat_renews_the_queue_lease(full: Full) -> None:
    conn, holder, waiter, t = full
    await heartbeat_at(conn, holder, t, lease_seconds=3600)
    await heartbeat_at(conn, waiter, t, lease_seconds=10)
    await heartbeat_at(conn, waiter, t + 8 * S, lease_seconds=10)
    await reconcile(conn, "p", t + 15 * S)
    assert await status(conn, waiter) == "queued"
    await heartbeat_at(conn, waiter, t + 16 * S)  # no lease_seconds: the request's own (300)
    await reconcile(conn, "p", t + 300 * S)
    assert await status(conn, waiter) == "queued"
    await reconcile(conn, "p", t + 316 * S)
    assert (await get(conn, waiter)).reason == "abandoned"


async def test_queued_heartbeat_without_any_lease_sets_no_queue_lease(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool_s(conn, {"gpu": 1})
    await mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=None)
    waiter = await mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=None)
    t = await db_now(conn)
    await heartbeat_at(conn, waiter.id, t)
    await reconcile(conn, "p", t + timedelta(days=400))
    assert await status(conn, waiter.id) == "queued"


async def test_queue_lease_ends_when_the_request_is_granted(full: Full) -> None:
    conn, holder, waiter, t = full
    await heartbeat_at(conn, waiter, t, lease_seconds=5)
    await db_requests.release_request(conn, holder)
    granted = await get(conn, waiter)
    assert granted.status == "allocated"
    await reconcile(conn, "p", t + 6 * S)  # past the queue lease, well within the lease
    assert await status(conn, waiter) == "allocated"
    assert await conn.fetchval("SELECT count(*) FROM respool.queue_leases") == 0


async def test_a_requeued_attempt_is_not_bound_by_the_old_queue_lease(
    conn: asyncpg.Connection,
) -> None:
    """Queue lease on attempt 1, then allocated, preempted and requeued as attempt 2."""
    await mk_pool(conn, "p", {"gpu": 2})
    await mk_policy(conn, "low", "p", priority=0)
    await mk_policy(conn, "high", "p", priority=10, reserved={"gpu": 2})
    first = await mk_req(conn, "low", "p", resources={"gpu": 2}, max_retries=1)
    t = await db_now(conn) + S
    await mk_req(conn, "high", "p", resources={"gpu": 1})  # reclaim: preempts and requeues
    waiting = await mk_req(conn, "low", "p", resources={"gpu": 2})
    await heartbeat_at(conn, waiting.id, t, lease_seconds=5)  # a queue lease on attempt 1
    await reconcile(conn, "p", t)
    again = await get(conn, first.id)
    assert (again.status, again.attempt) == ("queued", 2)
    await conn.execute(
        "INSERT INTO respool.queue_leases (request_id, attempt, expires_at) VALUES ($1, 1, $2)",
        first.id,
        t,
    )  # as if attempt 1 had been heartbeated while it waited
    await reconcile(conn, "p", t + 10 * S)
    assert await status(conn, first.id) == "queued"  # attempt 2 was never heartbeated
    assert (await get(conn, waiting.id)).reason == "abandoned"
    await assert_healthy(conn)


async def test_stale_attempt_heartbeat_sets_no_queue_lease(full: Full) -> None:
    conn, _, waiter, _ = full
    with pytest.raises(Conflict):
        await heartbeat_at(conn, waiter, await db_now(conn), lease_seconds=5, attempt=2)
    assert await conn.fetchval("SELECT count(*) FROM respool.queue_leases") == 0


async def test_abandoned_request_leaves_every_candidate_queue(conn: asyncpg.Connection) -> None:
    for name in ("a", "b"):
        await mk_pool(conn, name, {"gpu": 1})
        await mk_policy(conn, "S", name)
        await mk_req(conn, "S", name, resources={"gpu": 1}, lease_seconds=None)
    anywhere = await mk_req(conn, "S", None, resources={"gpu": 1})
    assert await queue_ids(conn, "a") == [anywhere.id] == await queue_ids(conn, "b")
    t = await db_now(conn) + S
    await heartbeat_at(conn, anywhere.id, t, lease_seconds=5)
    await reconcile(conn, "b", t + 5 * S)
    assert (await get(conn, anywhere.id)).reason == "abandoned"
    assert await queue_ids(conn, "a") == [] == await queue_ids(conn, "b")
    await assert_healthy(conn)
