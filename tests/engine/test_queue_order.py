"""Admission and queue order (docs/admission.md); every trigger grants in the same transaction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import asyncpg
import pytest
from engine_support import (
    assert_healthy,
    get,
    mk_policy,
    mk_pool,
    mk_pool_s,
    mk_req,
    policy_usage,
    pool_id,
    queue,
    queue_ids,
    status,
    statuses,
)
from respool_client import wire as q

from app.db import policies as db_policies
from app.db import pools as db_pools
from app.db import requests as db_requests


async def test_priority_descending(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 1})
    for subject, prio in (("lo", 0), ("mid", 5), ("hi", 10)):
        await mk_policy(conn, subject, "p", priority=prio)
    holder = await mk_req(conn, "lo", "p", resources={"gpu": 1})
    lo = await mk_req(conn, "lo", "p", resources={"gpu": 1})
    mid = await mk_req(conn, "mid", "p", resources={"gpu": 1})
    hi = await mk_req(conn, "hi", "p", resources={"gpu": 1})
    rows = await queue(conn, "p")
    assert [(r["request_id"], r["position"], r["priority"]) for r in rows] == [
        (hi.id, 1, 10),
        (mid.id, 2, 5),
        (lo.id, 3, 0),
    ]
    assert [(await get(conn, i)).queue_position for i in (hi.id, mid.id, lo.id)] == [1, 2, 3]
    assert "2 ahead" in (await get(conn, lo.id)).message
    await db_requests.release_request(conn, holder.id)
    assert await statuses(conn, hi.id, mid.id, lo.id) == ["allocated", "queued", "queued"]
    # the request carries its policy's priority
    assert (await get(conn, hi.id)).priority == 10
    await assert_healthy(conn)


async def test_in_share_before_an_earlier_borrower(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 4})
    await mk_policy(conn, "A", "p", reserved={"gpu": 2})
    await mk_policy(conn, "B", "p", reserved={"gpu": 2})
    a1 = await mk_req(conn, "A", "p", resources={"gpu": 2})  # in share
    await mk_req(conn, "A", "p", resources={"gpu": 2})  # borrows B's idle share
    borrower = await mk_req(conn, "A", "p", resources={"gpu": 2})  # queued first, would borrow
    in_share = await mk_req(conn, "B", "p", resources={"gpu": 2})  # queued later, in share
    assert await queue_ids(conn, "p") == [in_share.id, borrower.id]
    assert [r["priority"] for r in await queue(conn, "p")] == [0, 0]
    usage = await policy_usage(conn, "p", "A")
    assert (usage["gpu"]["used"], usage["gpu"]["borrowed"]) == (4, 2)
    await db_requests.release_request(conn, a1.id)
    assert await statuses(conn, in_share.id, borrower.id) == ["allocated", "queued"]
    await assert_healthy(conn)


async def test_queue_time_then_id(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 1})
    holder = await mk_req(conn, "S", "p", resources={"gpu": 1})
    early = await mk_req(conn, "S", "p", resources={"gpu": 1})
    # two requests created in one transaction share their queue time: the id breaks the tie
    async with conn.transaction():
        same_a = await mk_req(conn, "S", "p", resources={"gpu": 1})
        same_b = await mk_req(conn, "S", "p", resources={"gpu": 1})
    late = await mk_req(conn, "S", "p", resources={"gpu": 1})
    tied = sorted([same_a.id, same_b.id])
    assert await queue_ids(conn, "p") == [early.id, *tied, late.id]
    await db_requests.release_request(conn, holder.id)
    assert await status(conn, early.id) == "allocated"
    await db_requests.release_request(conn, early.id)
    assert await statuses(conn, tied[0], tied[1]) == ["allocated", "queued"]


# best_effort grants a small request past a big head that does not fit; strict keeps it queued.
BEHIND_A_BIG_ONE = pytest.mark.parametrize(
    ("queueing", "small_status"), [("best_effort", "allocated"), ("strict", "queued")]
)


@BEHIND_A_BIG_ONE
async def test_small_request_created_behind_a_big_one(
    conn: asyncpg.Connection, queueing: str, small_status: str
) -> None:
    await mk_pool_s(conn, {"gpu": 4}, queueing=queueing)
    await mk_req(conn, "S", "p", resources={"gpu": 3})  # 1 gpu free
    big = await mk_req(conn, "S", "p", resources={"gpu": 2})
    small = await mk_req(conn, "S", "p", resources={"gpu": 1})
    # best_effort skips the big one to grant the later small one; strict keeps it behind
    assert (big.status, small.status) == ("queued", small_status)
    if queueing == "strict":
        assert small.message == "fits, waiting for its turn; 1 ahead"
        assert small.queue_position == 2
    await assert_healthy(conn)


@BEHIND_A_BIG_ONE
async def test_release_behind_a_big_one(
    conn: asyncpg.Connection, queueing: str, small_status: str
) -> None:
    await mk_pool_s(conn, {"gpu": 4}, queueing=queueing)
    h1 = await mk_req(conn, "S", "p", resources={"gpu": 2})
    await mk_req(conn, "S", "p", resources={"gpu": 2})
    big = await mk_req(conn, "S", "p", resources={"gpu": 3})
    small = await mk_req(conn, "S", "p", resources={"gpu": 1})
    assert (big.status, small.status) == ("queued", "queued")
    await db_requests.release_request(conn, h1.id)  # 2 free: the big one still does not fit
    assert await statuses(conn, big.id, small.id) == ["queued", small_status]
    await assert_healthy(conn)


async def test_strict_grants_in_order_once_the_head_fits(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 4}, queueing="strict")
    h1 = await mk_req(conn, "S", "p", resources={"gpu": 4})
    big = await mk_req(conn, "S", "p", resources={"gpu": 3})
    small = await mk_req(conn, "S", "p", resources={"gpu": 1})
    more = await mk_req(conn, "S", "p", resources={"gpu": 1})
    await db_requests.release_request(conn, h1.id)
    assert await statuses(conn, big.id, small.id, more.id) == ["allocated", "allocated", "queued"]
    await assert_healthy(conn)


async def test_strict_head_cancelled_lets_the_queue_move(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 4}, queueing="strict")
    await mk_req(conn, "S", "p", resources={"gpu": 2})
    head = await mk_req(conn, "S", "p", resources={"gpu": 3})
    behind = await mk_req(conn, "S", "p", resources={"gpu": 2})
    assert behind.status == "queued"
    async with conn.transaction():
        await db_requests.cancel_request(conn, head.id)
        assert await status(conn, behind.id) == "allocated"  # same transaction
    await assert_healthy(conn)


async def test_limit_rule(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 8})
    await mk_policy(conn, "capped", "p", limit={"gpu": 3})
    await mk_policy(conn, "other", "p")
    first = await mk_req(conn, "capped", "p", resources={"gpu": 2})
    blocked = await mk_req(conn, "capped", "p", resources={"gpu": 2})
    assert blocked.status == "queued"
    assert "waiting for gpu: subject limit reached, 2/3 used, needs 2" in blocked.message
    # the pool has room: another subject behind it is granted (best_effort)
    other = await mk_req(conn, "other", "p", resources={"gpu": 4})
    assert other.status == "allocated"
    await db_requests.release_request(conn, first.id)
    assert await status(conn, blocked.id) == "allocated"
    assert (await policy_usage(conn, "p", "capped"))["gpu"]["used"] == 2
    await assert_healthy(conn)


async def test_non_preemptible_rule(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 8})
    await mk_policy(conn, "S", "p", reserved={"gpu": 3}, limit={"gpu": 8})
    np1 = await mk_req(conn, "S", "p", resources={"gpu": 2}, preemptible=False)
    np2 = await mk_req(conn, "S", "p", resources={"gpu": 2}, preemptible=False)
    assert (np1.status, np2.status) == ("allocated", "queued")
    assert "reserved share for non-preemptible work 2/3 used, needs 2" in np2.message
    # preemptible work of the same subject is not bound by the reserved share
    p1 = await mk_req(conn, "S", "p", resources={"gpu": 4})
    assert p1.status == "allocated"
    usage = (await policy_usage(conn, "p", "S"))["gpu"]
    assert (usage["used"], usage["np_used"], usage["reserved"]) == (6, 2, 3)
    await db_requests.release_request(conn, p1.id)
    assert await status(conn, np2.id) == "queued"  # freeing preemptible units does not help
    await db_requests.release_request(conn, np1.id)
    assert await status(conn, np2.id) == "allocated"
    assert (await policy_usage(conn, "p", "S"))["gpu"]["np_used"] == 2
    await assert_healthy(conn)


# --- triggers: each unblocks a queued request, which is granted in the same transaction -------

Setup = Callable[[asyncpg.Connection], Awaitable[tuple[object, object]]]


async def _full_pool(conn: asyncpg.Connection, **policy: object) -> tuple[q.Request, q.Request]:
    await mk_pool(conn, "p", {"gpu": 2})
    await mk_policy(conn, "S", "p", **policy)
    holder = await mk_req(conn, "S", "p", resources={"gpu": 2}, lease_seconds=60)
    waiting = await mk_req(conn, "S", "p", resources={"gpu": 1})
    assert waiting.status == "queued"
    return holder, waiting


async def _release(conn: asyncpg.Connection, holder: q.Request) -> None:
    await db_requests.release_request(conn, holder.id)


async def _cancel(conn: asyncpg.Connection, holder: q.Request) -> None:
    await db_requests.cancel_request(conn, holder.id)


async def _expire(conn: asyncpg.Connection, holder: q.Request) -> None:
    assert holder.lease_expires_at is not None
    lapsed = holder.lease_expires_at + timedelta(seconds=1)
    n = await conn.fetchval(
        "SELECT respool.expire_leases(p_pool_id => $1, p_now => $2)",
        await pool_id(conn, "p"),
        lapsed,
    )
    assert n == 1


async def _late_heartbeat(conn: asyncpg.Connection, holder: q.Request) -> None:
    assert holder.lease_expires_at is not None
    await conn.fetchval(
        "SELECT respool.heartbeat_request(p_id => $1, p_now => $2)",
        holder.id,
        holder.lease_expires_at + timedelta(seconds=1),
    )


async def _grow(conn: asyncpg.Connection, holder: q.Request) -> None:
    await db_pools.update_pool(conn, "p", capacity={"gpu": 3})


@pytest.mark.parametrize(
    ("trigger", "holder_status"),
    [
        (_release, "released"),
        (_cancel, "cancelled"),
        (_expire, "expired"),
        (_late_heartbeat, "expired"),
        (_grow, "allocated"),
    ],
    ids=["release", "cancel", "expiry", "heartbeat-after-lapse", "capacity-growth"],
)
async def test_trigger_grants_in_the_same_transaction(
    conn: asyncpg.Connection,
    trigger: Callable[[asyncpg.Connection, q.Request], Awaitable[None]],
    holder_status: str,
) -> None:
    holder, waiting = await _full_pool(conn)
    async with conn.transaction():
        await trigger(conn, holder)
        assert await statuses(conn, holder.id, waiting.id) == [holder_status, "allocated"]
    await assert_healthy(conn)


async def _at_the_limit(conn: asyncpg.Connection, gpu: int) -> tuple[q.Policy, q.Request]:
    """Pool p (8 GPUs), S limited to 2 and holding them; S's policy and its next request of
    ``gpu`` GPUs (waiting on the limit)."""
    await mk_pool(conn, "p", {"gpu": 8})
    pol = await mk_policy(conn, "S", "p", limit={"gpu": 2})
    await mk_req(conn, "S", "p", resources={"gpu": 2})
    return pol, await mk_req(conn, "S", "p", resources={"gpu": gpu})


async def test_limit_raise_grants_in_the_same_transaction(conn: asyncpg.Connection) -> None:
    pol, waiting = await _at_the_limit(conn, 2)
    assert waiting.status == "queued"
    async with conn.transaction():
        await db_policies.update_policy(conn, str(pol.id), limit={"gpu": 4})
        assert await status(conn, waiting.id) == "allocated"
    await assert_healthy(conn)


async def test_removing_a_limit_grants(conn: asyncpg.Connection) -> None:
    pol, waiting = await _at_the_limit(conn, 1)
    updated = await db_policies.update_policy(
        conn, str(pol.id), limit={"gpu": 0}
    )  # 0 removes the limit
    assert updated.limit == {}
    assert await status(conn, waiting.id) == "allocated"
    await assert_healthy(conn)


async def test_policy_delete_grants_to_others(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 2})
    gone = await mk_policy(conn, "gone", "p")
    await mk_policy(conn, "S", "p")
    holder = await mk_req(conn, "gone", "p", resources={"gpu": 2})
    waiting = await mk_req(conn, "S", "p", resources={"gpu": 2})
    await db_policies.delete_policy(conn, str(gone.id), force=True)
    got = await get(conn, holder.id)
    assert (got.status, got.reason) == ("cancelled", "policy_deleted")
    assert await status(conn, waiting.id) == "allocated"
    await assert_healthy(conn)
