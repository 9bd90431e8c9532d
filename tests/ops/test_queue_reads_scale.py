"""Reading the queue computes each pool's queue order once per read, never
once per queued request. Asserted structurally, on the number of calls of the per-pool and
per-entry SQL functions in the reading transaction (``track_functions = 'all'``), not on time;
the times are in ``python -m bench dashboard``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.db import named
from app.db import policies as db_policies
from app.db import pools as db_pools
from app.db import requests as db_requests
from support.db import function_calls

QUEUED = 12  # per pool
POOLS = ("q1", "q2")


@pytest.fixture
async def tracked(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    """Two full pools, each with QUEUED waiting requests in two shapes; function calls tracked."""
    for pool in POOLS:
        await db_pools.create_pool(conn, name=pool, capacity={"gpu": 1})
        for subject in ("a", "b"):
            await db_policies.create_policy(conn, subject=subject, pool=pool)
        await db_requests.create_request(
            conn, {"subject": "a", "pool": pool, "resources": {"gpu": 1}}
        )
        for i in range(QUEUED):
            await db_requests.create_request(
                conn, {"subject": "ab"[i % 2], "pool": pool, "resources": {"gpu": 1}}
            )
    assert await conn.fetchval("SELECT count(*) FROM respool.queue_entries") == QUEUED * 2
    await conn.execute("SET track_functions = 'all'")
    yield conn


async def test_dashboard_queue_orders_each_pool_once(tracked: asyncpg.Connection) -> None:
    async with tracked.transaction():
        rows = await tracked.fetch(named.query("dashboard_queue"), 200)
        assert len(rows) == QUEUED * 2
        assert [r["position"] for r in rows if r["pool"] == "q1"] == list(range(1, QUEUED + 1))
        assert all(r["waiting_for"].startswith("waiting for gpu") for r in rows)
        # Each pool's queue head once (not its whole order, not a position per entry).
        assert await function_calls(tracked, "respool._queue_top(uuid, integer)") == len(POOLS)
        assert await function_calls(tracked, "respool._queue_order(uuid)") == 0
        assert await function_calls(tracked, "respool._queue_position(uuid, uuid)") == 0


async def test_dashboard_queue_checks_blockers_only_for_the_rows_shown(
    tracked: asyncpg.Connection,
) -> None:
    async with tracked.transaction():
        rows = await tracked.fetch(named.query("dashboard_queue"), 5)
        assert len(rows) == 5
        # Once per shape among the rows shown (5 rows of q1, its two shapes), not per row.
        assert await function_calls(tracked, "respool._blocker(jsonb, boolean, uuid, uuid)") == 2
        assert await function_calls(tracked, "respool._queue_top(uuid, integer)") == len(POOLS)


async def test_request_list_orders_each_pool_once(tracked: asyncpg.Connection) -> None:
    async with tracked.transaction():
        listed = await db_requests.list_requests(tracked, status="queued", limit=1000)
        assert len(listed) == QUEUED * 2
        assert await function_calls(tracked, "respool._queue_position(uuid, uuid)") == 0
        assert await function_calls(tracked, "respool._queue_positions(uuid, uuid[])") == len(POOLS)
        assert await function_calls(tracked, "respool._queue_order(uuid)") == 0
        # Messages and ETAs too: once per pool and shape (two subjects' shapes per pool), never
        # once per request (tests/engine/test_request_pages.py has the mixed queue).
        assert await function_calls(
            tracked, "respool._blocker(jsonb, boolean, uuid, uuid)"
        ) == 2 * len(POOLS)
        assert await function_calls(
            tracked, "respool._eta_pool(uuid, timestamp with time zone, uuid)"
        ) == len(POOLS)
        assert (
            await function_calls(tracked, "respool._request_eta(uuid, timestamp with time zone)")
            == 0
        )
        assert await function_calls(tracked, "respool._request_json(uuid)") == 0
    # The positions are the ones a single read computes on its own (_queue_position).
    for r in listed:
        alone = await db_requests.get_request(tracked, r.id)
        assert r == alone
    assert sorted(r.queue_position or 0 for r in listed if r.pool == "q1") == list(
        range(1, QUEUED + 1)
    )


@pytest.fixture
async def tracked_with_history(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    """As ``tracked``, after ten finished holds per pool (the fewest an ETA goes by, so each pool
    has an ETA to run)."""
    for pool in POOLS:
        await db_pools.create_pool(conn, name=pool, capacity={"gpu": 1})
        for subject in ("a", "b"):
            await db_policies.create_policy(conn, subject=subject, pool=pool)
        for _ in range(10):
            done = await db_requests.create_request(
                conn, {"subject": "b", "pool": pool, "resources": {"gpu": 1}}
            )
            await db_requests.release_request(conn, done.request.id)
        await db_requests.create_request(
            conn, {"subject": "a", "pool": pool, "resources": {"gpu": 1}}
        )
        for i in range(QUEUED):
            await db_requests.create_request(
                conn, {"subject": "ab"[i % 2], "pool": pool, "resources": {"gpu": 1}}
            )
    await conn.execute("SET track_functions = 'all'")
    yield conn


async def test_dashboard_queue_runs_the_eta_once_per_pool_shown(
    tracked_with_history: asyncpg.Connection,
) -> None:
    conn = tracked_with_history
    eta = "respool._eta_pool(uuid, timestamp with time zone, uuid)"
    async with conn.transaction():
        rows = await conn.fetch(named.query("dashboard_queue"), 200)
        assert len(rows) == QUEUED * 2 and all(r["eta"] is not None for r in rows)
        # One simulation per pool (it estimates the pool's whole queue head), never per row.
        assert await function_calls(conn, eta) == len(POOLS)
        assert await function_calls(conn, "respool._eta(uuid, uuid, timestamp with time zone)") == 0
        # Only the pools among the rows shown: 5 rows, all of q1.
        before = await function_calls(conn, eta)
        rows = await conn.fetch(named.query("dashboard_queue"), 5)
        assert {r["pool"] for r in rows} == {"q1"}
        assert await function_calls(conn, eta) - before == 1
