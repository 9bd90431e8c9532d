"""A pass that grants many requests does it set-based, with the results the admission rules
prescribe for granting them one at a time in queue order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import asyncpg
import engine_support as es
import pytest

from app.db import requests as db_requests
from support.db import function_calls

GRANT_MANY = "respool._grant_many(uuid[], uuid, uuid, timestamptz, uuid[])"
TRY_GRANT = "respool._try_grant(uuid, uuid, uuid, timestamptz, respool.requests)"


async def _queue_behind_holder(
    conn: asyncpg.Connection, holder_gpus: int, shapes: list[int], subject: str = "S"
) -> tuple[UUID, list[UUID]]:
    """A holder of the whole pool, then one queued request per entry of ``shapes`` (GPUs)."""
    holder = await es.mk_req(conn, subject, "p", resources={"gpu": holder_gpus})
    waiting = [(await es.mk_req(conn, subject, "p", resources={"gpu": g})).id for g in shapes]
    return holder.id, waiting


async def test_one_release_grants_forty_in_queue_order_in_one_set_based_grant(
    conn: asyncpg.Connection,
) -> None:
    await es.mk_pool_s(conn, {"gpu": 40})
    holder, waiting = await _queue_behind_holder(conn, 40, [1] * 50)
    await conn.execute("SET track_functions = 'all'")
    async with conn.transaction():
        await db_requests.release_request(conn, holder)
        assert await function_calls(conn, GRANT_MANY) == 1
        assert await function_calls(conn, TRY_GRANT) <= 1  # not one round per request
    assert await es.statuses(conn, *waiting) == ["allocated"] * 40 + ["queued"] * 10
    assert await es.queue_ids(conn, "p") == waiting[40:]
    assert [(await es.get(conn, i)).queue_position for i in waiting[40:]] == list(range(1, 11))
    assert await es.allocated(conn, "p") == {"gpu": 40, "step_run": 40}
    first = await es.get(conn, waiting[0])
    assert (first.version, first.lease_expires_at is None) == (2, True)  # one status change
    assert await es.events(conn, waiting[0]) == [
        (None, "queued", None),
        ("queued", "allocated", None),
    ]
    await es.assert_healthy(conn)


async def test_a_run_stops_where_another_shape_queued_earlier(conn: asyncpg.Connection) -> None:
    # Same subject, two shapes: a1 a2 a3 b1 a4 a5 (GPUs 1 1 1 2 1 1), 5 GPUs freed. In queue
    # order a1, a2, a3 (3 used) then b1 (5 used): a4 and a5 come after b1 and no longer fit.
    await es.mk_pool_s(conn, {"gpu": 5})
    holder, (a1, a2, a3, b1, a4, a5) = await _queue_behind_holder(conn, 5, [1, 1, 1, 2, 1, 1])
    await db_requests.release_request(conn, holder)
    assert await es.statuses(conn, a1, a2, a3, b1, a4, a5) == ["allocated"] * 4 + ["queued"] * 2
    await es.assert_healthy(conn)


async def test_a_higher_priority_shape_goes_first_whole(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "lo", "p", priority=0)
    await es.mk_policy(conn, "hi", "p", priority=10)
    holder = await es.mk_req(conn, "lo", "p", resources={"gpu": 4})
    lo = [(await es.mk_req(conn, "lo", "p", resources={"gpu": 1})).id for _ in range(3)]
    hi = [(await es.mk_req(conn, "hi", "p", resources={"gpu": 1})).id for _ in range(3)]
    await db_requests.release_request(conn, holder.id)
    assert await es.statuses(conn, *hi, *lo) == ["allocated"] * 4 + ["queued"] * 2
    await es.assert_healthy(conn)


@pytest.mark.parametrize(
    ("policy", "preemptible", "granted", "blocker"),
    [
        ({"limit": {"gpu": 3}}, True, 3, "subject limit reached, 3/3 used"),
        ({"reserved": {"gpu": 2}}, False, 2, "reserved share for non-preemptible work 2/2 used"),
    ],
    ids=["subject-limit", "reserved-share"],
)
async def test_a_run_takes_what_the_subject_policy_allows(
    conn: asyncpg.Connection, policy: dict[str, Any], preemptible: bool, granted: int, blocker: str
) -> None:
    await es.mk_pool(conn, "p", {"gpu": 10})
    await es.mk_policy(conn, "S", "p", **policy)
    await es.mk_policy(conn, "T", "p")
    holder = await es.mk_req(conn, "T", "p", resources={"gpu": 10})
    waiting = [
        (await es.mk_req(conn, "S", "p", resources={"gpu": 1}, preemptible=preemptible)).id
        for _ in range(6)
    ]
    await db_requests.release_request(conn, holder.id)
    assert await es.statuses(conn, *waiting) == ["allocated"] * granted + ["queued"] * (6 - granted)
    assert blocker in (await es.get(conn, waiting[granted])).message
    assert await es.allocated(conn, "p") == {"gpu": granted, "step_run": granted}
    await es.assert_healthy(conn)


@pytest.fixture
async def other(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(db_url)
    try:
        yield c
    finally:
        await c.close()


@pytest.mark.parametrize(
    ("queueing", "expected"),
    [
        # strict stops at the request another transaction holds; best_effort goes around it
        ("strict", ["allocated", "allocated", "queued", "queued", "queued"]),
        ("best_effort", ["allocated", "allocated", "queued", "allocated", "allocated"]),
    ],
)
async def test_a_request_locked_elsewhere_ends_the_run(
    conn: asyncpg.Connection, other: asyncpg.Connection, queueing: str, expected: list[str]
) -> None:
    await es.mk_pool_s(conn, {"gpu": 5}, queueing=queueing)
    holder, waiting = await _queue_behind_holder(conn, 5, [1] * 5)
    async with other.transaction():
        await other.execute("SELECT FROM respool.requests WHERE id = $1 FOR UPDATE", waiting[2])
        await db_requests.release_request(conn, holder)
        assert await es.statuses(conn, *waiting) == expected
    await es.assert_healthy(conn)
