"""Pool resolution (docs/admission.md): one request, several candidate pools, granted in
exactly one."""

from __future__ import annotations

import asyncpg
import pytest
from engine_support import allocated, assert_healthy, mk_policy, mk_pool, mk_req, queue, status

from app.db import pools as db_pools
from app.db import requests as db_requests


@pytest.fixture
async def three(conn: asyncpg.Connection) -> asyncpg.Connection:
    """Pools a, b, c with gpu 2 each; subject S has policies on all three.

    Candidate order: priority desc, then pool name -> b (5), c (5), a (0)."""
    for name in ("a", "b", "c"):
        await mk_pool(conn, name, {"gpu": 2})
    await mk_policy(conn, "S", "a", priority=0)
    await mk_policy(conn, "S", "c", priority=5)
    await mk_policy(conn, "S", "b", priority=5)
    return conn


async def test_candidates_are_tried_by_priority_then_name(three: asyncpg.Connection) -> None:
    grants = [await mk_req(three, "S", resources={"gpu": 2}) for _ in range(3)]
    assert [(r.status, r.pool) for r in grants] == [
        ("allocated", "b"),
        ("allocated", "c"),
        ("allocated", "a"),
    ]
    for r in grants:
        assert r.pool_id == (await db_pools.get_pool(three, r.pool)).id
    assert [await allocated(three, p) for p in ("a", "b", "c")] == [{"gpu": 2, "step_run": 1}] * 3
    await assert_healthy(three)


async def test_falls_back_to_the_next_candidate(three: asyncpg.Connection) -> None:
    small = await mk_req(three, "S", resources={"gpu": 1})
    assert small.pool == "b"
    # b has 1 gpu left, so a 2-gpu request goes to c
    big = await mk_req(three, "S", resources={"gpu": 2})
    assert (big.status, big.pool) == ("allocated", "c")
    # and a 1-gpu request still fits in b
    again = await mk_req(three, "S", resources={"gpu": 1})
    assert (again.status, again.pool) == ("allocated", "b")
    await assert_healthy(three)


async def test_queued_in_every_candidate_granted_once(three: asyncpg.Connection) -> None:
    holders = {}
    for _ in range(3):
        r = await mk_req(three, "S", resources={"gpu": 2})
        holders[r.pool] = r
    waiting = await mk_req(three, "S", resources={"gpu": 2})
    assert waiting.status == "queued"
    assert waiting.pool is None and waiting.pool_id is None
    assert waiting.queue_position == 1
    rows = await queue(three)
    assert [(r["pool"], r["request_id"], r["position"]) for r in rows] == [
        ("a", waiting.id, 1),
        ("b", waiting.id, 1),
        ("c", waiting.id, 1),
    ]
    for pool in ("a", "b", "c"):  # the message says what it waits for, in each candidate
        assert f"{pool}: waiting for gpu: pool 2/2 used, needs 2" in waiting.message
    demand = await three.fetch(
        "SELECT pool, queued_demand FROM respool.pool_usage WHERE key = 'gpu' ORDER BY pool"
    )
    assert [(d["pool"], d["queued_demand"]) for d in demand] == [("a", 2), ("b", 2), ("c", 2)]

    # capacity frees in c (not the first candidate): granted there, and it leaves every queue
    await db_requests.release_request(three, holders["c"].id)
    got = await db_requests.get_request(three, waiting.id)
    assert (got.status, got.pool) == ("allocated", "c")
    assert await queue(three) == []
    # freeing more elsewhere grants nothing twice
    await db_requests.release_request(three, holders["a"].id)
    await db_requests.release_request(three, holders["b"].id)
    assert await status(three, waiting.id) == "allocated"
    assert await allocated(three, "a") == {} and await allocated(three, "b") == {}
    assert await allocated(three, "c") == {"gpu": 2, "step_run": 1}
    assert (
        await three.fetchval(
            "SELECT count(*) FROM respool.events WHERE request_id = $1 AND to_status = 'allocated'",
            waiting.id,
        )
        == 1
    )
    await assert_healthy(three)


async def test_capacity_growth_in_any_candidate_grants(three: asyncpg.Connection) -> None:
    for _ in range(3):
        await mk_req(three, "S", resources={"gpu": 2})
    waiting = await mk_req(three, "S", resources={"gpu": 1})
    await db_pools.update_pool(three, "a", capacity={"gpu": 3})
    got = await db_requests.get_request(three, waiting.id)
    assert (got.status, got.pool) == ("allocated", "a")
    assert await queue(three) == []
    await assert_healthy(three)


async def test_a_named_pool_is_the_only_candidate(three: asyncpg.Connection) -> None:
    first = await mk_req(three, "S", "a", resources={"gpu": 2})
    assert first.pool == "a"
    waiting = await mk_req(three, "S", "a", resources={"gpu": 1})
    assert (waiting.status, waiting.pool) == ("queued", "a")  # b and c are free but not asked for
    assert [(r["pool"], r["request_id"]) for r in await queue(three)] == [("a", waiting.id)]
    await assert_healthy(three)


async def test_a_single_policy_names_the_pool_while_queued(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "only", {"gpu": 1})
    await mk_policy(conn, "S", "only")
    await mk_req(conn, "S", resources={"gpu": 1})
    waiting = await mk_req(conn, "S", resources={"gpu": 1})
    assert (waiting.status, waiting.pool) == ("queued", "only")


async def test_rejected_only_when_every_candidate_rejects(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "big", {"gpu": 8})
    await mk_pool(conn, "limited", {"gpu": 4})
    await mk_pool(conn, "tpus", {"tpu": 4})
    await mk_policy(conn, "S", "limited", priority=9, limit={"gpu": 3})
    await mk_policy(conn, "S", "tpus", priority=5)
    await mk_policy(conn, "S", "big", priority=0)

    # limited rejects (limit), tpus rejects (no gpu), big accepts -> granted in big
    ok = await mk_req(conn, "S", resources={"gpu": 6})
    assert (ok.status, ok.pool) == ("allocated", "big")

    # every candidate rejects: the first candidate's reason, every candidate's message
    r = await mk_req(conn, "S", resources={"gpu": 9})
    assert (r.status, r.reason, r.pool) == ("rejected", "exceeds_capacity", None)
    assert "limited" in r.message and "tpus" in r.message and "big" in r.message
    assert r.message.index("limited") < r.message.index("tpus") < r.message.index("big")

    r = await mk_req(conn, "S", resources={"gpu": 4}, preemptible=False)
    assert (r.status, r.reason) == ("rejected", "exceeds_limit")
    assert "pool tpus does not provide gpu" in r.message
    await assert_healthy(conn)


async def test_queued_only_where_it_can_ever_fit(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "small", {"gpu": 2})
    await mk_pool(conn, "large", {"gpu": 8})
    await mk_policy(conn, "S", "small", priority=1)
    await mk_policy(conn, "S", "large")
    holder = await mk_req(conn, "S", resources={"gpu": 8})
    assert holder.pool == "large"
    waiting = await mk_req(conn, "S", resources={"gpu": 4})
    assert waiting.status == "queued"
    assert [(r["pool"], r["request_id"]) for r in await queue(conn)] == [("large", waiting.id)]
    # the small pool, free, never grants it
    await mk_req(conn, "S", "small", resources={"gpu": 1})
    assert await status(conn, waiting.id) == "queued"
    await db_requests.release_request(conn, holder.id)
    got = await db_requests.get_request(conn, waiting.id)
    assert (got.status, got.pool) == ("allocated", "large")
    await assert_healthy(conn)


async def test_cancel_leaves_every_queue(three: asyncpg.Connection) -> None:
    for _ in range(3):
        await mk_req(three, "S", resources={"gpu": 2})
    waiting = await mk_req(three, "S", resources={"gpu": 2})
    assert len(await queue(three)) == 3
    cancelled = await db_requests.cancel_request(three, waiting.id)
    assert cancelled.status == "cancelled"
    assert await queue(three) == []
    await assert_healthy(three)
