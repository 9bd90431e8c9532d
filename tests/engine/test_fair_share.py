"""Fair share (docs/scheduling.md): ``ordering: fair`` orders requests of equal priority and
in-share class by their subject's dominant share in the pool (lowest first);
``fifo`` keeps queue time."""

from __future__ import annotations

import asyncpg
import pytest
from engine_support import assert_healthy, mk_policy, mk_pool, mk_req, queue_ids, status

from app.db import requests as db_requests


async def _scenario(conn: asyncpg.Connection, ordering: str) -> tuple[str, str]:
    """A holds 6 of 8 GPUs, B holds none; both queue a 1-GPU request, A's first. Which of
    the two is granted when one GPU frees up, and which is still queued?"""
    await mk_pool(conn, "p", {"gpu": 8, "tpu": 4}, ordering=ordering, starvation_seconds=None)
    for subject in ("a", "b", "filler"):
        await mk_policy(conn, subject, "p")
    a_held = [await mk_req(conn, "a", "p", resources={"gpu": 1}) for _ in range(6)]
    filler = [await mk_req(conn, "filler", "p", resources={"gpu": 1}) for _ in range(2)]
    assert all(r.status == "allocated" for r in a_held + filler)
    a_next = await mk_req(conn, "a", "p", resources={"gpu": 1})
    b_next = await mk_req(conn, "b", "p", resources={"gpu": 1})
    expected_queue = [a_next.id, b_next.id] if ordering == "fifo" else [b_next.id, a_next.id]
    assert await queue_ids(conn, "p") == expected_queue
    assert [(await db_requests.get_request(conn, i)).queue_position for i in expected_queue] == [
        1,
        2,
    ]
    await db_requests.release_request(conn, filler[0].id)
    statuses = {"a": await status(conn, a_next.id), "b": await status(conn, b_next.id)}
    assert sorted(statuses.values()) == ["allocated", "queued"], statuses  # one unit freed
    granted = next(s for s, st in statuses.items() if st == "allocated")
    waiting = next(s for s, st in statuses.items() if st == "queued")
    await assert_healthy(conn)
    return granted, waiting


@pytest.mark.parametrize(("ordering", "first"), [("fifo", "a"), ("fair", "b")])
async def test_fifo_serves_the_earlier_request_fair_the_lower_dominant_share(
    conn: asyncpg.Connection, ordering: str, first: str
) -> None:
    granted, waiting = await _scenario(conn, ordering)
    assert (granted, waiting) == (first, "b" if first == "a" else "a")


async def test_dominant_share_is_the_maximum_over_tracked_keys(conn: asyncpg.Connection) -> None:
    # A holds 1/8 GPU but 3/4 TPU (share 0.75); B holds 4/8 GPU (share 0.5): B goes first.
    await mk_pool(conn, "p", {"gpu": 8, "tpu": 4}, ordering="fair", starvation_seconds=None)
    for subject in ("a", "b"):
        await mk_policy(conn, subject, "p")
    await mk_req(conn, "a", "p", resources={"gpu": 1, "tpu": 3})
    await mk_req(conn, "b", "p", resources={"gpu": 4})
    blocker = await mk_req(conn, "b", "p", resources={"gpu": 3})
    a_next = await mk_req(conn, "a", "p", resources={"gpu": 1})
    b_next = await mk_req(conn, "b", "p", resources={"gpu": 1})
    # B now holds 7/8 GPU (0.875) > A's 0.75: A first.
    assert await queue_ids(conn, "p") == [a_next.id, b_next.id]
    await db_requests.release_request(conn, blocker.id)  # B back to 0.5 < 0.75: B first
    assert await status(conn, b_next.id) == "allocated"
    assert await status(conn, a_next.id) == "allocated"  # 2 GPUs were freed
    await assert_healthy(conn)


async def test_priority_and_in_share_still_come_first(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 8}, ordering="fair", starvation_seconds=None)
    await mk_policy(conn, "hi", "p", priority=5)
    await mk_policy(conn, "lo", "p")
    await mk_req(conn, "hi", "p", resources={"gpu": 7})
    await mk_req(conn, "lo", "p", resources={"gpu": 1})
    hi = await mk_req(conn, "hi", "p", resources={"gpu": 1})  # share 7/8, but higher priority
    lo = await mk_req(conn, "lo", "p", resources={"gpu": 1})
    assert await queue_ids(conn, "p") == [hi.id, lo.id]
