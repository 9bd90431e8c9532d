"""What one create → allocated → release cycle writes. One new row version of
the request per status change, no queue entry for a request granted in its creating call, and
the counters moved in one statement for both tables."""

from __future__ import annotations

import asyncpg
import engine_support as es

from app.db import requests as db_requests

TABLES = ("requests", "queue_entries", "events", "pool_resources", "policy_resources")


async def _counts(conn: asyncpg.Connection) -> dict[str, tuple[int, int, int]]:
    """(inserted, updated, deleted) rows per table as this backend counts them (its pending
    statistics may still hold earlier transactions' counts: compare two readings)."""
    rows = await conn.fetch(
        "SELECT t AS name, pg_stat_get_xact_tuples_inserted(('respool.' || t)::regclass) AS ins,"
        "       pg_stat_get_xact_tuples_updated(('respool.' || t)::regclass) AS upd,"
        "       pg_stat_get_xact_tuples_deleted(('respool.' || t)::regclass) AS del"
        "  FROM unnest($1::text[]) t",
        list(TABLES),
    )
    return {r["name"]: (r["ins"], r["upd"], r["del"]) for r in rows}


class Writes:
    """Rows written per table between ``start()`` and ``__getitem__`` (same transaction)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.before: dict[str, tuple[int, int, int]] = {}

    async def start(self) -> Writes:
        self.before = await _counts(self.conn)
        return self

    async def of(self, table: str) -> tuple[int, int, int]:
        now, then = (await _counts(self.conn))[table], self.before[table]
        return (now[0] - then[0], now[1] - then[1], now[2] - then[2])


async def test_a_create_granted_at_once_writes_its_row_twice_and_no_queue_entry(
    conn: asyncpg.Connection,
) -> None:
    await es.mk_pool_s(conn, {"gpu": 2, "cpu": 8})
    first = await es.mk_req(conn, "S", "p", resources={"gpu": 1, "cpu": 2})
    await db_requests.release_request(conn, first.id)  # every counter row exists from now on
    async with conn.transaction():
        writes = await Writes(conn).start()
        r = await es.mk_req(conn, "S", "p", resources={"gpu": 1, "cpu": 2})
        assert r.status == "allocated"
        assert await writes.of("requests") == (1, 1, 0)  # stored, then granted
        assert await writes.of("queue_entries") == (0, 0, 0)
        assert await writes.of("events") == (2, 0, 0)  # new -> queued -> allocated
        # three keys (gpu, cpu, step_run), one row each, on the pool and on the policy
        assert await writes.of("pool_resources") == (0, 3, 0)
        assert await writes.of("policy_resources") == (0, 3, 0)


async def test_a_release_writes_the_request_once(conn: asyncpg.Connection) -> None:
    await es.mk_pool_s(conn, {"gpu": 2})
    r = await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    async with conn.transaction():
        writes = await Writes(conn).start()
        released = await db_requests.release_request(conn, r.id)
        assert (released.status, released.version, released.lease_expires_at) == (
            "released",
            3,
            None,
        )
        assert await writes.of("requests") == (0, 1, 0)
        assert await writes.of("events") == (1, 0, 0)
        assert await writes.of("pool_resources") == (0, 2, 0)
        assert await writes.of("policy_resources") == (0, 2, 0)
    await es.assert_healthy(conn)


async def test_a_request_that_waits_is_queued_as_before(conn: asyncpg.Connection) -> None:
    await es.mk_pool_s(conn, {"gpu": 1})
    await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    async with conn.transaction():
        writes = await Writes(conn).start()
        waiting = await es.mk_req(conn, "S", "p", resources={"gpu": 1})
        assert (waiting.status, waiting.queue_position) == ("queued", 1)
        assert await writes.of("requests") == (1, 0, 0)
        assert await writes.of("queue_entries") == (1, 0, 0)
    await es.assert_healthy(conn)
