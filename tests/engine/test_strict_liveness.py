"""No pass leaves a queue a fresh pass would grant from (docs/admission.md, "What triggers
allocation"): with nothing running, a waiter that fits is never left behind.

The queue order is taken at the start of a pass, and the pass's own grants can change it: a
subject's next request that was in its reserved share no longer is once the subject's first one
is granted, and moves behind the in-share requests of others. A strict pool stopped at such a
request walks its queue again in the new order, in the same transaction (found by the storm,
tests/engine/test_storm.py). And a request granted in one pool leaves its other candidates'
queues: a strict one it was the head of moves in the same transaction too."""

from __future__ import annotations

import asyncpg
from engine_support import assert_healthy, mk_policy, mk_pool, mk_req, pool_id, statuses

from app.db import reconcile as db_reconcile
from app.db import requests as db_requests


async def test_strict_pass_walks_again_when_its_grants_change_the_order(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool(conn, "p", {"gpu": 3}, queueing="strict")
    await mk_policy(conn, "A", "p", reserved={"gpu": 2})
    await mk_policy(conn, "B", "p", reserved={"gpu": 1})
    await mk_policy(conn, "C", "p")
    await mk_req(conn, "C", "p", resources={"gpu": 1})
    big = await mk_req(conn, "C", "p", resources={"gpu": 2})  # the pool is full
    # With A holding nothing all three are in their share: the queue is a1, a2, b.
    a1 = await mk_req(conn, "A", "p", resources={"gpu": 1})
    a2 = await mk_req(conn, "A", "p", resources={"gpu": 2})
    b = await mk_req(conn, "B", "p", resources={"gpu": 1})
    assert await statuses(conn, a1.id, a2.id, b.id) == ["queued"] * 3
    # 2 gpu free: a1 is granted, a2 (2) does not fit. With a1 held, a2 would borrow (1 + 2 > 2)
    # and goes behind b, which is in B's share and fits the last free gpu.
    await db_requests.release_request(conn, big.id)
    assert await statuses(conn, a1.id, a2.id, b.id) == ["allocated", "queued", "allocated"]
    assert await db_reconcile.allocate_pool(conn, await pool_id(conn, "p")) == 0
    await assert_healthy(conn)


async def test_strict_head_granted_in_another_pool_lets_the_queue_move(
    conn: asyncpg.Connection,
) -> None:
    """A request waiting in two pools, at the head of a strict one, is granted in the other:
    the strict queue behind it moves in the same transaction."""
    await mk_pool(conn, "other", {"gpu": 2})
    await mk_pool(conn, "strict", {"gpu": 2}, queueing="strict")
    for pool in ("other", "strict"):
        await mk_policy(conn, "S", pool)
    await mk_policy(conn, "T", "strict")
    elsewhere = await mk_req(conn, "S", "other", resources={"gpu": 2})
    await mk_req(conn, "T", "strict", resources={"gpu": 1})  # 1 gpu free in strict
    both = await mk_req(conn, "S", None, resources={"gpu": 2})  # waits in both, head of strict
    small = await mk_req(conn, "T", "strict", resources={"gpu": 1})  # fits, waits behind it
    assert await statuses(conn, both.id, small.id) == ["queued", "queued"]
    await db_requests.release_request(conn, elsewhere.id)  # both is granted in other
    assert await statuses(conn, both.id, small.id) == ["allocated", "allocated"]
    for pool in ("other", "strict"):
        assert await db_reconcile.allocate_pool(conn, await pool_id(conn, pool)) == 0
    await assert_healthy(conn)
