"""The reporting views (sql/views/020_reporting.sql) agree with the base tables, and with the
numbers the scripted history makes by construction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from support import scenario
from support.db import direct
from support.scenario import D1, D2, EXPECTED_STATUS, at


@pytest.fixture(scope="module")
async def hist(module_db_url: str) -> dict[str, UUID]:
    async with direct(module_db_url) as conn:
        ids = await scenario.history(conn)
        ids |= await scenario.live(conn)
        return ids


@pytest.fixture
async def db(module_db_url: str, hist: dict[str, UUID]) -> AsyncIterator[asyncpg.Connection]:
    async with direct(module_db_url) as conn:
        yield conn


async def test_the_history_is_what_the_scenario_says(
    db: asyncpg.Connection, hist: dict[str, UUID]
) -> None:
    rows = await db.fetch("SELECT id, status FROM respool.requests")
    by_id = {r["id"]: r["status"] for r in rows}
    for name, status in EXPECTED_STATUS.items():
        assert by_id[hist[name]] == status, name
    assert by_id[hist["b3"]] == "allocated" and by_id[hist["c2"]] == "queued"
    assert await db.fetch("SELECT * FROM respool.invariant_violations") == []


async def test_holdings_are_the_allocated_and_preempting_requests(db: asyncpg.Connection) -> None:
    view = await db.fetch(
        "SELECT request_id, pool, subject, status, resources FROM respool.holdings"
    )
    base = await db.fetch(
        "SELECT id, pool_name, subject, status, resources FROM respool.requests"
        " WHERE status IN ('allocated', 'preempting')"
    )
    assert sorted(tuple(r) for r in view) == sorted(tuple(r) for r in base)
    assert {r["status"] for r in view} == {"allocated", "preempting"}


def _intervals_from_events(events: list[asyncpg.Record]) -> list[tuple[UUID, datetime, Any]]:
    """Walk each request's events in order: allocated opens an interval, anything but
    allocated/preempting closes it."""
    out: list[tuple[UUID, datetime, Any]] = []
    open_at: dict[UUID, datetime] = {}
    for e in events:
        rid = e["request_id"]
        if e["to_status"] == "allocated":
            open_at[rid] = e["at"]
        elif e["to_status"] != "preempting" and rid in open_at:
            out.append((rid, open_at.pop(rid), e["at"]))
    out += [(rid, start, None) for rid, start in open_at.items()]
    return out


async def test_allocation_intervals_follow_the_events(db: asyncpg.Connection) -> None:
    events = await db.fetch("SELECT request_id, at, to_status FROM respool.events ORDER BY id")
    expected = sorted(_intervals_from_events(events), key=lambda t: (t[1], str(t[0])))
    view = await db.fetch(
        "SELECT request_id, started_at, ended_at FROM respool.allocation_intervals"
        " ORDER BY started_at, request_id::text"
    )
    assert [tuple(r) for r in view] == expected


async def test_usage_by_subject_day_matches_a_python_split(db: asyncpg.Connection) -> None:
    now: datetime = await db.fetchval("SELECT now()")
    rows = await db.fetch(
        "SELECT i.started_at, i.ended_at, i.pool, i.subject, i.resources"
        "  FROM respool.allocation_intervals i"
    )
    expected: dict[tuple[date, str, str, str], float] = defaultdict(float)
    for r in rows:
        start, end = r["started_at"], r["ended_at"] or now
        day = datetime(start.year, start.month, start.day, tzinfo=UTC)
        while day < end:
            nxt = day + timedelta(days=1)
            hours = (min(end, nxt) - max(start, day)).total_seconds() / 3600
            if hours > 0:
                for key, amount in r["resources"].items():
                    expected[(day.date(), r["pool"], r["subject"], key)] += amount * hours
            day = nxt
    view = await db.fetch(
        "SELECT day, pool, subject, key, unit_hours FROM respool.usage_by_subject_day"
    )
    got = {(r["day"], r["pool"], r["subject"], r["key"]): float(r["unit_hours"]) for r in view}
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        # the live rows keep growing with now(): allow the seconds between the two reads
        assert got[k] == pytest.approx(v, abs=0.01), k


async def test_gpu_hours_of_the_scripted_days(db: asyncpg.Connection) -> None:
    rows = await db.fetch(
        "SELECT day, pool, subject, unit_hours FROM respool.usage_by_subject_day"
        " WHERE key = 'gpu' AND day <= $1",
        D2.date(),
    )
    got = {(r["day"], r["pool"], r["subject"]): r["unit_hours"] for r in rows}
    d1, d2 = D1.date(), D2.date()
    assert got == {
        (d1, "gpus", "team-b"): Decimal(12),  # b1: 6 gpu, 22:00-24:00
        (d2, "gpus", "team-b"): Decimal(11),  # b1 6 x 0.5 h + b2 2 x 4 h
        (d2, "gpus", "team-a"): Decimal(6),  # a1: 4 gpu, 00:30-02:00
        (d2, "gpus", "team-c"): Decimal("0.25"),  # x1 5 min + k1 10 min, 1 gpu
        (d1, "tiny", "team-d"): Decimal(12),  # d1 from 12:00, still held
        (d2, "tiny", "team-d"): Decimal(24),
        (d1, "grace", "team-e"): Decimal(28),  # e1: 2 gpu from 10:00, still preempting
        (d2, "grace", "team-e"): Decimal(48),
    }


async def test_request_waits(db: asyncpg.Connection, hist: dict[str, UUID]) -> None:
    rows = await db.fetch("SELECT request_id, subject, wait_seconds FROM respool.request_waits")
    waits = {r["request_id"]: r["wait_seconds"] for r in rows}
    assert waits[hist["a1"]] == 5400.0
    for name in ("b1", "b2", "c1", "x1", "k1", "d1", "e1", "b3"):
        assert waits[hist[name]] == 0.0, name
    for name in ("r1", "d2", "f1", "c2"):  # never granted
        assert hist[name] not in waits
    granted = await db.fetchval("SELECT count(*) FROM respool.events WHERE to_status = 'allocated'")
    assert len(rows) == granted


async def test_preemptions(db: asyncpg.Connection, hist: dict[str, UUID]) -> None:
    rows = await db.fetch(
        "SELECT request_id, subject, reason, with_grace, at FROM respool.preemptions"
    )
    got = {(r["request_id"], r["reason"], r["with_grace"], r["at"]) for r in rows}
    assert got == {
        (hist["b1"], "reclaim", False, at(D2, 0, 30)),
        (hist["e1"], "reclaim", True, at(D1, 11)),
    }


async def test_every_view_has_a_comment(db: asyncpg.Connection) -> None:
    missing = await db.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'respool' AND c.relkind = 'v'"
        "   AND obj_description(c.oid, 'pg_class') IS NULL"
    )
    assert missing == []
    no_comment = await db.fetch(
        "SELECT p.oid::regprocedure::text AS f FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'respool' AND p.proname IN"
        "   ('prune_requests', 'grant_reader', 'revoke_reader')"
        "   AND obj_description(p.oid, 'pg_proc') IS NULL"
    )
    assert no_comment == []
