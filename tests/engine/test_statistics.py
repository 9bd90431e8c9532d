"""Statistics of a young database (docs/ops.md): a respool table that holds at least 1,000 rows and
twice the rows its statistics say is analyzed, by ``respool.analyze_grown_tables`` and by the
reconciler, so that the plans every connection keeps are made again for its size."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest
from engine_support import mk_pool_s

from app.db.connect import connect
from app.reconciler import Reconciler


async def _create(conn: asyncpg.Connection, n: int) -> None:
    """``n`` granted one-GPU requests of subject S in pool p, a batch of up to 1,000 at a time."""
    for start in range(0, n, 1000):
        members = [{"subject": "S", "pool": "p", "resources": {"gpu": 1}}] * min(1000, n - start)
        await conn.execute("SELECT count(*) FROM respool.create_requests($1::jsonb)", members)
    # The counts analyze_grown_tables reads are sent when a transaction ends (at most once a
    # second unless forced).
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT 1")


async def _setup(conn: asyncpg.Connection) -> None:
    """Pool p with subject S, and no autovacuum on this test database's tables: an ANALYZE of
    its own between a table's growth and the check would decide the check."""
    await conn.execute(
        "DO $$ DECLARE t text; BEGIN"
        " FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'respool' LOOP"
        " EXECUTE format('ALTER TABLE respool.%I SET (autovacuum_enabled = off)', t);"
        " END LOOP; END $$"
    )
    await mk_pool_s(conn, {"gpu": 100_000})


async def _analyzed(conn: asyncpg.Connection) -> list[str]:
    tables: list[str] = await conn.fetchval("SELECT respool.analyze_grown_tables()")
    return tables


async def _row_estimate(conn: asyncpg.Connection, table: str) -> float:
    estimate: float = await conn.fetchval(
        "SELECT reltuples FROM pg_class WHERE oid = $1::regclass", f"respool.{table}"
    )
    return estimate


async def test_a_table_is_analyzed_once_it_doubles(conn: asyncpg.Connection) -> None:
    await _setup(conn)
    await _create(conn, 500)
    assert "requests" not in await _analyzed(conn)  # fewer than 1,000 rows

    await _create(conn, 1000)
    assert "requests" in await _analyzed(conn)
    assert await _row_estimate(conn, "requests") == 1500

    await _create(conn, 1000)  # 2,500 rows: not yet twice the 1,500 its statistics say
    assert "requests" not in await _analyzed(conn)

    await _create(conn, 500)  # 3,000
    assert "requests" in await _analyzed(conn)
    assert await _row_estimate(conn, "requests") == 3000


async def test_one_caller_analyzes_while_the_others_skip(db_url: str) -> None:
    first = await connect(db_url, application_name="respool-test")
    second = await connect(db_url, application_name="respool-test")
    try:
        await _setup(first)
        await _create(first, 1000)
        async with first.transaction():
            assert "requests" in await _analyzed(first)
            assert await _analyzed(second) == []  # the first one's transaction is still open
    finally:
        await first.close()
        await second.close()


async def test_the_reconciler_analyzes_a_table_that_grew(db_url: str) -> None:
    conn = await connect(db_url, application_name="respool-test")
    reconciler = Reconciler(db_url, interval=0.05)
    loop = asyncio.create_task(reconciler.run())
    try:
        await _setup(conn)
        await _create(conn, 1200)
        for _ in range(200):  # bounded: up to 10 s
            if "requests" in reconciler.analyzed:
                break
            await asyncio.sleep(0.05)
        assert "requests" in reconciler.analyzed
        assert await _row_estimate(conn, "requests") == 1200
    finally:
        reconciler.stop()
        await asyncio.wait_for(loop, 10)
        await conn.close()


async def test_a_failing_analyze_leaves_the_reconciler_passing(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = await connect(db_url, application_name="respool-test")
    await conn.execute(
        "CREATE OR REPLACE FUNCTION respool.analyze_grown_tables(p_min_rows bigint DEFAULT 1000)"
        " RETURNS text[] LANGUAGE plpgsql AS $$ BEGIN"
        " RAISE EXCEPTION 'canceling statement due to statement timeout' USING ERRCODE = '57014';"
        " END $$"
    )
    reconciler = Reconciler(db_url, interval=0.05)
    with caplog.at_level(logging.INFO, logger="respool.reconciler"):
        loop = asyncio.create_task(reconciler.run())
        try:
            for _ in range(200):  # bounded: up to 10 s
                if reconciler.sweeps >= 5:
                    break
                await asyncio.sleep(0.05)
        finally:
            reconciler.stop()
            await asyncio.wait_for(loop, 10)
            await conn.close()
    messages = [r.getMessage() for r in caplog.records]
    assert reconciler.sweeps >= 5
    assert any("analyzing grown tables failed (next try in 60s)" in m for m in messages), messages
    assert not any("reconnecting" in m for m in messages), messages


async def _rows_read_by_scans(conn: asyncpg.Connection) -> int:
    """Rows of ``respool.requests`` read by sequential scans so far, the counts of this
    connection's finished transactions included."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT 1")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    read: int = await conn.fetchval(
        "SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = 'respool.requests'::regclass"
    )
    return read


async def _cycles(conn: asyncpg.Connection, n: int) -> None:
    for _ in range(n):
        rid = await conn.fetchval(
            "SELECT (request ->> 'id')::uuid FROM respool.create_request("
            '\'{"subject": "S", "pool": "p", "resources": {"gpu": 1}}\')'
        )
        await conn.execute("SELECT respool.release_request($1)", rid)


async def test_once_analyzed_a_grown_table_is_read_by_its_index(db_url: str) -> None:
    """The trap and its way out: plans a connection made while ``requests`` held a page scan
    the whole table after it grew; once it is analyzed, the same connection plans again and
    finds each request by its primary key."""
    steps = await connect(db_url, application_name="respool-test")
    other = await connect(db_url, application_name="respool-test")
    try:
        await _setup(steps)
        await _cycles(steps, 20)  # its plans are kept from a table of a page
        await _create(other, 3000)
        before = await _rows_read_by_scans(steps)
        await _cycles(steps, 5)
        stale = await _rows_read_by_scans(steps) - before
        assert stale >= 3000  # at least one whole-table scan: the kept plans
        assert "requests" in await _analyzed(other)
        before = await _rows_read_by_scans(steps)
        await _cycles(steps, 5)
        assert await _rows_read_by_scans(steps) - before < 100
    finally:
        await steps.close()
        await other.close()
