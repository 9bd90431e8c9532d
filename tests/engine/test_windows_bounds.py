"""Time windows at their edges (docs/preemption.md, "Time windows"): only IANA time zone names;
far one-time windows are checked without sweeping to their end; a weekly window that starts
or ends in the hour skipped when the clocks go forward keeps the part of it that exists."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from engine_support import mk_pool
from test_windows import OFFICE, WEEKLY, assert_spans, policy, update, utc

from app.db import policies as db_policies
from app.db.errors import BadInput, Conflict


@pytest.mark.parametrize("zone", ["localtime", "posixrules", "posix/Europe/Berlin", "right/UTC"])
async def test_zone_files_that_are_not_iana_zones_are_refused(
    conn: asyncpg.Connection, zone: str
) -> None:
    await mk_pool(conn, "p", {"gpu": 8})
    windows = [WEEKLY, {**WEEKLY, "timezone": zone}]
    with pytest.raises(BadInput) as err:
        await policy(conn, "S", utc("2026-01-05T00:00"), windows=windows)
    assert err.value.field == "windows[1].timezone"
    assert zone in err.value.message
    assert await db_policies.list_policies(conn) == []


# Without the bound, each of these expands every day up to year 9999 for every policy with a
# weekly window (millions of rows: minutes); the limit turns such a hang into a failure.
CHECK_LIMIT = "SET statement_timeout = '20s'"


async def test_a_one_time_window_ending_in_9999_beside_weekly_ones_is_checked_at_once(
    conn: asyncpg.Connection,
) -> None:
    await conn.execute(CHECK_LIMIT)
    now = utc("2026-01-05T00:00")
    await mk_pool(conn, "p", {"gpu": 8})
    await policy(conn, "prod", now, reserved={"gpu": 6}, windows=OFFICE)
    forever = [{"start": "2027-01-01T00:00:00Z", "end": "9999-12-31T00:00:00Z"}]
    got = await policy(conn, "launch", now, reserved={"gpu": 2}, windows=forever)
    assert (got.active, got.next_change) == (False, utc("2027-01-01T00:00"))
    # A stored far window costs every later change of the pool nothing more either.
    await policy(conn, "other", now, reserved={"gpu": 0}, windows=OFFICE)
    with pytest.raises(Conflict) as err:
        await update(conn, got.id, now, reserved={"gpu": 3})
    # Friday 2027-01-01, 09:00 in Berlin (winter): the first instant both are in force.
    assert "add up to 9 at 2027-01-01T08:00:00Z" in err.value.message


async def test_a_conflict_inside_a_far_one_time_window_is_found(
    conn: asyncpg.Connection,
) -> None:
    """Shares that meet only in summer time, and only once a far one-time window has begun:
    the check still finds the first such instant, years ahead."""
    await conn.execute(CHECK_LIMIT)
    now = utc("2026-01-05T00:00")
    await mk_pool(conn, "p", {"gpu": 8})
    await policy(conn, "prod", now, reserved={"gpu": 6}, windows=OFFICE)
    # Monday 07:00-08:00 UTC meets Berlin's 09:00 only in summer time: 6 + 1 fits.
    early = [{"timezone": "UTC", "days": ["mon"], "from": "07:00", "to": "08:00"}]
    await policy(conn, "research", now, reserved={"gpu": 1}, windows=early)
    from_2040 = [{"start": "2040-01-01T00:00:00Z", "end": "9999-12-31T00:00:00Z"}]
    with pytest.raises(Conflict) as err:
        await policy(conn, "late", now, reserved={"gpu": 2}, windows=from_2040)
    # 6 + 1 + 2 on the first summer-time Monday of 2040, at 07:00 UTC (09:00 in Berlin).
    assert "add up to 9 at 2040-03-26T07:00:00Z" in err.value.message
    await policy(conn, "late", now, reserved={"gpu": 1}, windows=from_2040)  # 6 + 1 + 1 fits


# --- the hour skipped when the clocks go forward (Berlin: 2026-03-29, 02:00 -> 03:00) ----------


def _sunday(zone: str, start: str, end: str) -> list[dict[str, Any]]:
    return [{"timezone": zone, "days": ["sun"], "from": start, "to": end}]


# name: (windows, from, to, the spans in force between them), all UTC.
SPRING_GAP: dict[str, tuple[list[dict[str, Any]], str, str, list[tuple[str, str]]]] = {
    # 02:30 does not exist that night; 03:00-03:30 CEST does (01:00-01:30 UTC).
    "a window starting in the spring gap starts when the clocks jump": (
        _sunday("Europe/Berlin", "02:30", "03:30"), "2026-03-28T00:00", "2026-03-30T00:00",
        [("2026-03-29T01:00", "2026-03-29T01:30")]),
    # Any other Sunday: the whole hour (winter time, 01:30-02:30 UTC).
    "the same window on any other Sunday is the whole hour": (
        _sunday("Europe/Berlin", "02:30", "03:30"), "2026-03-21T00:00", "2026-03-23T00:00",
        [("2026-03-22T01:30", "2026-03-22T02:30")]),
    # 01:30-02:00 CET exists (00:30-01:00 UTC); then the clocks jump to 03:00 CEST.
    "a window ending in the spring gap ends when the clocks jump": (
        _sunday("Europe/Berlin", "01:30", "02:30"), "2026-03-28T00:00", "2026-03-30T00:00",
        [("2026-03-29T00:30", "2026-03-29T01:00")]),
    # A 30-minute gap (Lord Howe Island: 02:00 -> 02:30 on 2026-10-04, UTC+10:30 -> +11).
    "a window ending in a 30-minute spring gap ends when the clocks jump": (
        _sunday("Australia/Lord_Howe", "02:10", "03:00"), "2026-10-03T00:00", "2026-10-05T00:00",
        [("2026-10-03T15:30", "2026-10-03T16:00")]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SPRING_GAP))
async def test_spring_gap(conn: asyncpg.Connection, name: str) -> None:
    await assert_spans(conn, *SPRING_GAP[name])
