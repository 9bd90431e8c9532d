"""A new request that heads a best_effort queue ends the starvation hold in its own create
(docs/scheduling.md: the head is the first request in queue order that does not fit; docs/
admission.md: a new request triggers allocation in its transaction).

Found by the model test (tests/engine/test_model.py): a create took the short path (try only the
new request) whenever the pool held for nobody *after* the request joined. When the new request
came ahead of a starving head, the hold it ended was gone by then, so the requests that hold had
kept back stayed queued though they fit, until the next reconciler pass; a capacity shrink in
between then preempted other work instead.

Time is the test's own clock (explicit ``p_now``), two hours in the past, so nothing sleeps.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import asyncpg
import engine_support as es

HOLD = 10


async def test_a_new_head_ends_the_hold_and_grants_what_it_kept_back(
    conn: asyncpg.Connection,
) -> None:
    await es.mk_pool(conn, "p", {"gpu": 2}, starvation_seconds=HOLD)
    await es.mk_policy(conn, "low", "p", priority=0)
    await es.mk_policy(conn, "high", "p", priority=1)
    t0 = await es.db_now(conn) - timedelta(hours=2)

    async def create(subject: str, gpu: int, seconds: int) -> UUID:
        doc = await es.create_at(conn, subject, "p", {"gpu": gpu}, t0 + timedelta(seconds=seconds))
        return UUID(doc["id"])

    running = await create("low", 1, 0)
    starving = await create("low", 2, 1)  # 1 GPU free: waits, the head
    kept_back = await create("low", 1, 1 + HOLD)  # the head starves: its last GPU is held
    assert await es.statuses(conn, running, starving, kept_back) == [
        "allocated",
        "queued",
        "queued",
    ]
    assert (await es.get(conn, kept_back)).message.startswith("held: pool reserves gpu")

    # A higher-priority request that does not fit comes ahead: it is the head now, and it has
    # not waited, so the pool holds for nobody and the kept-back request fits.
    new_head = await create("high", 2, 2 + HOLD)
    assert await es.statuses(conn, running, starving, kept_back, new_head) == [
        "allocated",
        "queued",
        "allocated",
        "queued",
    ]
    # The create left the queue as a full pass would: nothing more to grant.
    pool_id = await es.pool_id(conn, "p")
    assert (
        await conn.fetchval(
            "SELECT respool.allocate_pool($1, $2)", pool_id, t0 + timedelta(seconds=2 + HOLD)
        )
        == 0
    )
    await es.assert_healthy(conn)

    # The reported symptom: a shrink now preempts the most recently allocated, the kept-back one.
    await conn.execute(
        "SELECT respool.update_pool(p_ref => 'p', p_capacity => '{\"gpu\": 1}', p_now => $1)",
        t0 + timedelta(seconds=3 + HOLD),
    )
    await es.reconcile(conn, "p", t0 + timedelta(seconds=4 + HOLD))
    assert [
        (r.status, r.reason) for r in [await es.get(conn, i) for i in (running, kept_back)]
    ] == [
        ("allocated", None),
        ("preempted", "capacity_shrink"),
    ]
    await es.assert_healthy(conn)
