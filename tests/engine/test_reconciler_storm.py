"""Three reconcilers on the same pools during the concurrency storm of test_storm.py.

The 64 storm workers now also ask for retries and 1-second leases (that only heartbeats keep
alive), and three :class:`app.reconciler.Reconciler` loops, each on its own connection, reconcile
every pool every 50 ms and on every notification. The auditor checks I1-I4 on a snapshot every
100 ms. Afterwards: no reconciler pass failed, every victim was preempted exactly once per
attempt, preemption and lease expiry both happened, and every unit comes back.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from test_storm import STORM_SECONDS, _run_storm, _setup, drain

from app.db.connect import APP_CLI, connect
from app.reconciler import Reconciler

pytestmark = pytest.mark.slow  # measured: tens of seconds (pytest --durations)

RECONCILERS = 3

_PREEMPTED_TWICE = """
SELECT request_id, attempt, count(*) AS n FROM respool.events
 WHERE from_status = 'allocated' AND to_status IN ('preempting', 'preempted')
 GROUP BY request_id, attempt HAVING count(*) > 1
"""


async def test_three_reconcilers_keep_invariants_and_never_double_preempt(db_url: str) -> None:
    conn = await connect(db_url, application_name=APP_CLI)
    reconcilers = [Reconciler(db_url, interval=0.05) for _ in range(RECONCILERS)]
    loops = [asyncio.create_task(r.run()) for r in reconcilers]
    try:
        await _setup(conn)
        st = await _run_storm(db_url, STORM_SECONDS, retries=True)
        for r in reconcilers:
            r.stop()
        await asyncio.wait_for(asyncio.gather(*loops), 30)
        summary = st.summary(st.ops_duration)
        outcomes = dict(
            await conn.fetch(
                "SELECT coalesce(reason, to_status), count(*) FROM respool.events"
                " WHERE from_status IN ('allocated', 'preempting') GROUP BY 1"
            )
        )
        passes = [r.passes for r in reconcilers]
        print(f"\n{summary}\nreconciler passes {passes}; endings by reason {outcomes}")
        context = (
            f"{summary}\nviolations: {st.violations[:10]}\nerrors: {st.errors_sample[:10]}\n"
            f"unexpected: {st.unexpected[:10]}"
        )

        assert [f for r in reconcilers for f in r.failures] == []
        assert not st.unexpected, context
        assert (st.deadlocks, st.rp500) == (0, 0), context
        assert st.violations == [], context
        assert all(n > 0 for n in passes), passes  # each of the three did real passes
        assert [dict(r) for r in await conn.fetch(_PREEMPTED_TWICE)] == []
        preempted = outcomes.get("reclaim", 0) + outcomes.get("priority", 0)
        assert preempted > 0 and outcomes.get("lease_expired", 0) > 0, outcomes
        assert await drain(conn) == ([], 0, [])
    finally:
        for r in reconcilers:
            r.stop()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await conn.close()


async def test_reconcile_pool_skips_a_pool_another_transaction_holds(
    conn: asyncpg.Connection, db_url: str
) -> None:
    await _setup(conn)
    pool_id = await conn.fetchval("SELECT id FROM respool.pools ORDER BY name LIMIT 1")
    other = await connect(db_url, application_name=APP_CLI)
    try:
        async with other.transaction():
            await other.execute("SELECT respool.lock_pools(ARRAY[$1::uuid])", pool_id)
            assert await conn.fetchval("SELECT respool.reconcile_pool($1)", pool_id) is None
        assert await conn.fetchval("SELECT respool.reconcile_pool($1)", pool_id) is not None
    finally:
        await other.close()
