"""Policies over time (docs/preemption.md, "Time windows"): a policy's reserved share is in force
only inside its windows; weekly windows follow their time zone's daylight saving time; reserved
shares must fit the pool at every instant; a boundary is a policy change for the next pass.

Every time-dependent call takes an injected clock (``p_now``); nothing sleeps.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import msgspec
import pytest
from engine_support import events, mk_pool, mk_req, status
from respool_client.wire import Policy

from app.db import policies as db_policies
from app.db import pools as db_pools
from app.db import reconcile as db_reconcile
from app.db import requests as db_requests
from app.db.errors import BadInput, Conflict, translate
from support.db import RECONCILE_POOL, direct

WEEKDAYS = ["mon", "tue", "wed", "thu", "fri"]
OFFICE = [{"timezone": "Europe/Berlin", "days": WEEKDAYS, "from": "09:00", "to": "17:00"}]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


async def sql(conn: asyncpg.Connection, query: str, *args: Any) -> Any:
    """One value of ``query``; an engine error comes out as the wrappers' (Conflict, ...)."""
    try:
        return await conn.fetchval(query, *args)
    except asyncpg.PostgresError as exc:
        err = translate(exc)
        if err is None:
            raise
        raise err from None


async def window_state(
    conn: asyncpg.Connection, windows: list[dict[str, Any]] | None, now: datetime
) -> tuple[bool, datetime | None]:
    row = await conn.fetchrow(
        "SELECT * FROM respool._window_state(respool._windows($1), $2)", windows, now
    )
    assert row is not None
    return row["active"], row["next_change"]


async def spans(
    conn: asyncpg.Connection, windows: list[dict[str, Any]], start: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    rows = await conn.fetch(
        "SELECT * FROM respool._window_spans(respool._windows($1), $2, $3)", windows, start, end
    )
    return [(r["starts_at"], r["ends_at"]) for r in rows]


async def assert_states(
    conn: asyncpg.Connection,
    windows: list[dict[str, Any]] | None,
    cases: list[tuple[str, tuple[bool, str | None]]],
) -> None:
    """At each UTC time ``at`` of ``cases``, ``windows`` are (active, next change); a next change
    of None is never."""
    for at, (active, until) in cases:
        expected = (active, None if until is None else utc(until))
        assert await window_state(conn, windows, utc(at)) == expected, at


async def assert_spans(
    conn: asyncpg.Connection,
    windows: list[dict[str, Any]],
    start: str,
    end: str,
    expected: list[tuple[str, str]],
) -> None:
    """From UTC ``start`` to ``end``, ``windows`` are in force exactly over ``expected``."""
    got = await spans(conn, windows, utc(start), utc(end))
    assert got == [(utc(a), utc(b)) for a, b in expected]


async def policy(
    conn: asyncpg.Connection,
    subject: str,
    now: datetime,
    *,
    pool: str = "p",
    windows: list[dict[str, Any]] | None = None,
    **kw: Any,
) -> Policy:
    """create_policy at ``now`` (the wrappers use the database's clock), as the API answers it."""
    doc = await sql(
        conn,
        "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_reserved => $3,"
        " p_limit => $4, p_windows => $5, p_now => $6)",
        subject,
        pool,
        kw.get("reserved", {}),
        kw.get("limit", {}),
        windows,
        now,
    )
    return msgspec.convert(doc, Policy)


async def get_policy(conn: asyncpg.Connection, subject: str) -> Policy:
    doc = await conn.fetchval(
        "SELECT respool.policy_json(id) FROM respool.policies WHERE subject = $1", subject
    )
    return msgspec.convert(doc, Policy)


REMOVE = object()  # update(windows=REMOVE): the JSON value null (always active)


async def update(conn: asyncpg.Connection, ref: Any, now: datetime, **kw: Any) -> Policy:
    """update_policy at ``now`` with the named arguments (windows: None keeps them, a list
    replaces them, REMOVE removes them)."""
    sent = {k: v for k, v in kw.items() if v is not REMOVE}
    args = [f"p_{k} => ${i + 3}" for i, k in enumerate(sent)]
    args += [f"p_{k} => 'null'::jsonb" for k, v in kw.items() if v is REMOVE]
    doc = await sql(
        conn,
        f"SELECT respool.update_policy({', '.join(['p_ref => $1', 'p_now => $2', *args])})",
        str(ref),
        now,
        *sent.values(),
    )
    return msgspec.convert(doc, Policy)


async def boundary_pass(conn: asyncpg.Connection, pool: str, now: datetime) -> tuple[int, Any]:
    """A reconciler pass at ``now``, in one transaction: the pool's lock (SKIP LOCKED, as the
    pass takes it) and respool._apply_windows, to count the policies that flip, then
    respool.reconcile_pool (which applies due boundaries itself: it finds none left).
    Returns (policies flipped, the pass's summary; None when skipped)."""
    async with conn.transaction():
        flipped = await conn.fetchval(
            "WITH locked AS MATERIALIZED (SELECT id FROM respool.pools WHERE name = $1"
            " FOR NO KEY UPDATE SKIP LOCKED) SELECT respool._apply_windows(id, $2) FROM locked",
            pool,
            now,
        )
        summary = await conn.fetchval(RECONCILE_POOL, pool, now)
    return (flipped or 0), summary


# --- windows: validation ------------------------------------------------------------------------


async def test_windows_are_normalized(conn: asyncpg.Connection) -> None:
    got = await conn.fetchval(
        "SELECT respool._windows($1)",
        [
            {
                "timezone": "Europe/Berlin",
                "days": ["fri", "mon", "fri"],
                "from": "09:00",
                "to": "17:00",
            },
            {"timezone": "UTC", "from": "22:00", "to": "06:00"},
            {"start": "2026-03-01T01:00:00+01:00", "end": "2026-03-02T00:00:00Z"},
        ],
    )
    assert got == [
        {"timezone": "Europe/Berlin", "days": ["mon", "fri"], "from": "09:00", "to": "17:00"},
        {"timezone": "UTC", "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
         "from": "22:00", "to": "06:00"},
        {"start": "2026-03-01T00:00:00Z", "end": "2026-03-02T00:00:00Z"},
    ]  # fmt: skip
    assert await conn.fetchval("SELECT respool._windows(NULL) IS NULL")
    assert await conn.fetchval("SELECT respool._windows('null'::jsonb) IS NULL")


WEEKLY = {"timezone": "UTC", "from": "09:00", "to": "10:00"}
ONCE = {"start": "2026-03-01T00:00:00Z", "end": "2026-03-02T00:00:00Z"}


@pytest.mark.parametrize(
    ("windows", "field"),
    [
        ({"timezone": "UTC"}, "windows"),
        ([], "windows"),
        ([WEEKLY] * 65, "windows"),
        ([WEEKLY, 3], "windows[1]"),
        ([{**WEEKLY, "timezone": "Mars/Olympus"}], "windows[0].timezone"),
        ([{**WEEKLY, "timezone": "CEST"}], "windows[0].timezone"),
        ([WEEKLY, {"from": "09:00", "to": "10:00"}], "windows[1].timezone"),
        ([{**WEEKLY, "from": "9:00"}], "windows[0].from"),
        ([{**WEEKLY, "to": "24:00"}], "windows[0].to"),
        ([{"timezone": "UTC", "from": "09:00"}], "windows[0].to"),
        ([{**WEEKLY, "days": ["mon", "Tue"]}], "windows[0].days"),
        ([{**WEEKLY, "days": []}], "windows[0].days"),
        ([{**WEEKLY, "every": "day"}], "windows[0].every"),
        ([{**WEEKLY, **ONCE}], "windows[0]"),
        ([ONCE, {**ONCE, "end": ONCE["start"]}], "windows[1].end"),
        ([{**ONCE, "start": "2026-03-01T00:00:00"}], "windows[0].start"),
        ([{**ONCE, "start": "2026-02-30T00:00:00Z"}], "windows[0].start"),
        ([{"start": ONCE["start"]}], "windows[0].end"),
    ],
)
async def test_bad_windows_name_the_field_and_change_nothing(
    conn: asyncpg.Connection, windows: Any, field: str
) -> None:
    now = utc("2026-01-05T00:00:00")
    await mk_pool(conn, "p", {"gpu": 8})
    with pytest.raises(BadInput) as err:
        await policy(conn, "S", now, windows=windows)
    assert err.value.field == field
    assert await db_policies.list_policies(conn) == []
    ok = await policy(conn, "T", now, reserved={"gpu": 1})
    with pytest.raises(BadInput) as err:
        await update(conn, ok.id, now, windows=windows)
    assert err.value.field == field
    assert await get_policy(conn, "T") == ok


# --- weekly windows and daylight saving time ----------------------------------------------------


NIGHT = [{"timezone": "Europe/Berlin", "days": ["sat"], "from": "22:00", "to": "06:00"}]
SMALL_HOURS = [{"timezone": "Europe/Berlin", "days": ["sun"], "from": "02:00", "to": "03:00"}]
ONCE_AT_7 = [{"start": "2026-03-02T07:00:00Z", "end": "2026-03-02T08:00:00Z"}]

# name: (windows, from, to, the spans in force between them), all UTC.
SPANS: dict[str, tuple[list[dict[str, Any]], str, str, list[tuple[str, str]]]] = {
    # 09:00-17:00 in Berlin is 08:00-16:00 UTC in winter, 07:00-15:00 UTC in summer (from the
    # last Sunday of March, 2026-03-29, to the last Sunday of October, 2026-10-25).
    "office hours in Berlin move in UTC with summer time": (
        OFFICE, "2026-03-27T00:00", "2026-04-01T00:00", [
            ("2026-03-27T08:00", "2026-03-27T16:00"),
            ("2026-03-30T07:00", "2026-03-30T15:00"),
            ("2026-03-31T07:00", "2026-03-31T15:00"),
        ]),
    # Saturday 22:00 CET to Sunday 06:00 CEST: the spring night is 7 hours long.
    "a window crossing midnight belongs to the day it starts": (
        NIGHT, "2026-03-27T00:00", "2026-04-06T00:00", [
            ("2026-03-28T21:00", "2026-03-29T04:00"),
            ("2026-04-04T20:00", "2026-04-05T04:00"),
        ]),
    # docs/preemption.md: a local time that does not exist is the first instant after the gap,
    # one that exists twice is read as standard time (the later instant, PostgreSQL's rule).
    # 2026-03-29: 02:00 and 03:00 local both come out as 01:00 UTC: no window that day.
    "local times that do not exist: no window": (
        SMALL_HOURS, "2026-03-28T00:00", "2026-03-30T00:00", []),
    # 2026-10-25: 02:00 is read as 02:00 CET (01:00 UTC), 03:00 CET is 02:00 UTC.
    "local times that exist twice: standard time": (
        SMALL_HOURS, "2026-10-24T00:00", "2026-10-26T00:00", [
            ("2026-10-25T01:00", "2026-10-25T02:00"),
        ]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SPANS))
async def test_window_spans(conn: asyncpg.Connection, name: str) -> None:
    await assert_spans(conn, *SPANS[name])


# name: (windows, [(at, (active, next change or None for never))]), all UTC.
STATES: dict[str, tuple[list[dict[str, Any]] | None, list[tuple[str, tuple[bool, str | None]]]]] = {
    "office hours in Berlin move in UTC with summer time": (OFFICE, [
        # Friday before the spring change: active, then closed for the weekend until Monday
        # 07:00 UTC.
        ("2026-03-27T10:00", (True, "2026-03-27T16:00")),
        ("2026-03-27T17:00", (False, "2026-03-30T07:00")),
        ("2026-03-30T07:30", (True, "2026-03-30T15:00")),
        # Friday before the autumn change: Monday opens at 08:00 UTC again.
        ("2026-10-23T14:00", (True, "2026-10-23T15:00")),
        ("2026-10-23T17:00", (False, "2026-10-26T08:00")),
        ("2026-10-26T07:30", (False, "2026-10-26T08:00")),
        # The end is exclusive: at 16:00 UTC on a winter Friday the policy is already off.
        ("2026-03-27T16:00", (False, "2026-03-30T07:00")),
    ]),
    "a window crossing midnight belongs to the day it starts": (NIGHT, [
        ("2026-03-29T03:00", (True, "2026-03-29T04:00")),
        # Sunday night is not a Saturday: off until next Saturday 22:00 CEST.
        ("2026-03-29T21:30", (False, "2026-04-04T20:00")),
        # The autumn night is 9 hours long.
        ("2026-10-24T20:00", (True, "2026-10-25T05:00")),
    ]),
    # from = to: 24 hours.
    "from = to is the whole day": (
        [{"timezone": "UTC", "days": ["mon"], "from": "12:00", "to": "12:00"}],
        [("2026-03-03T11:00", (True, "2026-03-03T12:00"))]),
    "a one-time window": (ONCE_AT_7, [
        ("2026-03-01T00:00", (False, "2026-03-02T07:00")),
        ("2026-03-02T07:00", (True, "2026-03-02T08:00")),
        ("2026-03-02T08:00", (False, None)),  # never again
    ]),
    # A one-time window touching a weekly one: one span, so no change at 08:00.
    "a one-time window merged with its weekly neighbour": (
        [*ONCE_AT_7, {"timezone": "UTC", "from": "08:00", "to": "09:00"}],
        [("2026-03-02T07:30", (True, "2026-03-02T09:00"))]),
    "no windows: always active": (None, [("2026-03-02T07:30", (True, None))]),
    "a weekly window from = to every day: always active": (
        [{"timezone": "Asia/Kolkata", "from": "05:30", "to": "05:30"}],
        [("2026-03-02T07:30", (True, None))]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(STATES))
async def test_window_states(conn: asyncpg.Connection, name: str) -> None:
    await assert_states(conn, *STATES[name])


# --- reserved shares at every instant -----------------------------------------------------------


async def test_shares_overlapping_on_one_weekday_are_refused(conn: asyncpg.Connection) -> None:
    now = utc("2026-03-20T00:00")  # a Friday in winter
    await mk_pool(conn, "p", {"gpu": 8})
    await policy(conn, "prod", now, reserved={"gpu": 6}, windows=OFFICE)
    evening = [
        {"timezone": "Europe/Berlin", "days": ["sat", "sun", "mon"], "from": "16:00", "to": "20:00"}
    ]
    with pytest.raises(Conflict) as err:
        await policy(conn, "research", now, reserved={"gpu": 4}, windows=evening)
    # Monday 16:00-17:00 Berlin, the first one 2026-03-23 15:00 UTC
    assert err.value.message == (
        "gpu: reserved shares add up to 10 at 2026-03-23T15:00:00Z but the pool capacity would "
        "be 8 (prod reserves 6, research reserves 4)"
    )
    assert [p.subject for p in await db_policies.list_policies(conn)] == ["prod"]
    weekend = [
        {"timezone": "Europe/Berlin", "days": ["sat", "sun"], "from": "16:00", "to": "20:00"}
    ]
    await policy(conn, "research", now, reserved={"gpu": 4}, windows=weekend)


async def test_shares_overlapping_only_in_summer_time_are_refused(conn: asyncpg.Connection) -> None:
    now = utc("2026-01-05T00:00")
    await mk_pool(conn, "p", {"gpu": 8})
    await policy(conn, "prod", now, reserved={"gpu": 6}, windows=OFFICE)
    early = [{"timezone": "UTC", "days": WEEKDAYS, "from": "07:00", "to": "08:00"}]
    # In winter 07:00-08:00 UTC ends when Berlin's 09:00 begins; in summer they overlap.
    with pytest.raises(Conflict) as err:
        await policy(conn, "research", now, reserved={"gpu": 4}, windows=early)
    assert err.value.message == (
        "gpu: reserved shares add up to 10 at 2026-03-30T07:00:00Z but the pool capacity would "
        "be 8 (prod reserves 6, research reserves 4)"
    )
    # After the autumn change and before the next spring one, the check looks a year ahead.
    with pytest.raises(Conflict) as err:
        await policy(conn, "research", utc("2026-10-26T00:00"), reserved={"gpu": 4}, windows=early)
    assert "at 2027-03-29T07:00:00Z" in err.value.message


async def test_windows_that_never_overlap_may_each_reserve_the_whole_pool(
    conn: asyncpg.Connection,
) -> None:
    now = utc("2026-01-05T00:00")
    await mk_pool(conn, "p", {"gpu": 8})
    day = [{"timezone": "Europe/Berlin", "from": "08:00", "to": "20:00"}]
    night = [{"timezone": "Europe/Berlin", "from": "20:00", "to": "08:00"}]
    await policy(conn, "day", now, reserved={"gpu": 8}, windows=day)
    await policy(conn, "night", now, reserved={"gpu": 8}, windows=night)
    # A policy without windows counts at every instant.
    with pytest.raises(Conflict) as err:
        await policy(conn, "always", now, reserved={"gpu": 1})
    assert "reserved shares add up to 9 at 2026-01-05T00:00:00Z" in err.value.message
    assert "always reserves 1, night reserves 8" in err.value.message
    # Growing a share or widening a window is checked the same way.
    day_id = (await get_policy(conn, "day")).id
    longer = [{"timezone": "Europe/Berlin", "from": "08:00", "to": "20:01"}]
    with pytest.raises(Conflict):
        await update(conn, day_id, now, windows=longer)
    assert [w.to for w in (await get_policy(conn, "day")).windows or []] == ["20:00"]
    # ... and a capacity shrink (pool updates use the database's clock).
    with pytest.raises(Conflict) as err:
        await db_pools.update_pool(conn, "p", capacity={"gpu": 7})
    assert "reserved shares add up to 8 at " in err.value.message


async def test_one_time_windows_beyond_a_year_are_checked(conn: asyncpg.Connection) -> None:
    now = utc("2026-01-05T00:00")
    await mk_pool(conn, "p", {"gpu": 8})
    await policy(conn, "prod", now, reserved={"gpu": 6})
    late = [{"start": "2028-06-01T00:00:00Z", "end": "2028-06-02T00:00:00Z"}]
    with pytest.raises(Conflict) as err:
        await policy(conn, "launch", now, reserved={"gpu": 4}, windows=late)
    assert "add up to 10 at 2028-06-01T00:00:00Z" in err.value.message
    # A window that has passed reserves nothing any more.
    past = [{"start": "2025-06-01T00:00:00Z", "end": "2025-06-02T00:00:00Z"}]
    got = await policy(conn, "launch", now, reserved={"gpu": 4}, windows=past)
    assert (got.active, got.next_change) == (False, None)


async def test_without_windows_the_message_keeps_its_shape(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 8})
    await policy(conn, "A", utc("2026-01-05T00:00"), reserved={"gpu": 5})
    with pytest.raises(Conflict) as err:
        await policy(conn, "B", utc("2026-01-05T00:00"), reserved={"gpu": 4})
    assert err.value.message == (
        "gpu: reserved shares add up to 9 but the pool capacity would be 8"
        " (A reserves 5, B reserves 4)"
    )


# --- shares in force, borrowing and the boundary ------------------------------------------------


async def test_outside_its_window_a_policy_borrows_and_its_limit_still_applies(
    conn: asyncpg.Connection,
) -> None:
    t0 = await conn.fetchval("SELECT now()")
    window = [
        {
            "start": (t0 + timedelta(hours=1)).isoformat(),
            "end": (t0 + timedelta(hours=2)).isoformat(),
        }
    ]
    await mk_pool(conn, "p", {"gpu": 6})
    pol = await policy(conn, "prod", t0, reserved={"gpu": 3}, limit={"gpu": 3}, windows=window)
    assert (pol.active, pol.next_change, pol.reserved) == (
        False,
        t0 + timedelta(hours=1),
        {"gpu": 3},
    )
    await policy(conn, "dev", t0)
    held = await mk_req(conn, "prod", "p", resources={"gpu": 3})
    assert held.status == "allocated"
    got = await get_policy(conn, "prod")
    assert (got.usage["gpu"], got.borrowed, got.reserved) == (3, {"gpu": 3}, {"gpu": 3})
    # The limit still caps it although the pool has 3 free units.
    over = await mk_req(conn, "prod", "p", resources={"gpu": 1})
    assert over.status == "queued"
    await boundary_pass(conn, "p", t0 + timedelta(minutes=30))
    assert await status(conn, over.id) == "queued"
    # Inside the window the same usage is in share.
    flipped, _ = await boundary_pass(conn, "p", t0 + timedelta(hours=1))
    assert flipped == 1
    got = await get_policy(conn, "prod")
    assert (got.active, got.next_change) == (True, t0 + timedelta(hours=2))
    assert (got.usage["gpu"], got.borrowed) == (3, {})
    assert await status(conn, over.id) == "queued"  # still over its limit
    flipped, _ = await boundary_pass(conn, "p", t0 + timedelta(hours=2))
    got = await get_policy(conn, "prod")
    assert (flipped, got.active, got.next_change, got.borrowed) == (1, False, None, {"gpu": 3})


async def _borrowed_pool(conn: asyncpg.Connection) -> tuple[datetime, UUID, UUID]:
    """Pool p (gpu 4): prod reserves 3 from t0 + 1 h, dev borrows all 4 now and prod waits for 2.
    Returns (t0, dev's allocation, prod's queued request)."""
    t0 = await conn.fetchval("SELECT now()")
    window = [
        {
            "start": (t0 + timedelta(hours=1)).isoformat(),
            "end": (t0 + timedelta(hours=2)).isoformat(),
        }
    ]
    await mk_pool(conn, "p", {"gpu": 4})
    await policy(conn, "prod", t0, reserved={"gpu": 3}, windows=window)
    await policy(conn, "dev", t0)
    dev = await mk_req(conn, "dev", "p", resources={"gpu": 4})
    prod = await mk_req(conn, "prod", "p", resources={"gpu": 2})
    assert (dev.status, prod.status) == ("allocated", "queued")
    return t0, dev.id, prod.id


async def test_at_the_boundary_the_pass_reclaims_for_the_policy(conn: asyncpg.Connection) -> None:
    t0, dev, prod = await _borrowed_pool(conn)
    # Before its window, prod has no share in force: nothing to reclaim, equal priorities.
    assert (await boundary_pass(conn, "p", t0 + timedelta(minutes=59)))[0] == 0
    assert [await status(conn, dev), await status(conn, prod)] == ["allocated", "queued"]
    flipped, summary = await boundary_pass(conn, "p", t0 + timedelta(hours=1))
    assert flipped == 1 and summary["preempted"] == 1
    assert [await status(conn, dev), await status(conn, prod)] == ["preempted", "allocated"]
    assert (await events(conn, dev))[-1] == ("allocated", "preempted", "reclaim")


async def test_two_passes_at_one_boundary_act_once(conn: asyncpg.Connection, db_url: str) -> None:
    t0, dev, prod = await _borrowed_pool(conn)
    at = t0 + timedelta(hours=1)
    async with direct(db_url) as other:
        await other.execute("SET lock_timeout = '10s'")  # a blocked pass fails, never hangs
        tx = conn.transaction()
        await tx.start()
        try:
            first = await boundary_pass(conn, "p", at)  # holds the pool until commit
            second = await boundary_pass(other, "p", at)  # skips the locked pool
        finally:
            await tx.commit()
        third = await boundary_pass(other, "p", at)  # same instant, after the first committed
    assert first[0] == 1 and first[1]["preempted"] == 1
    assert second == (0, None)
    assert third[0] == 0 and third[1]["preempted"] == 0
    flips = await conn.fetchval("SELECT active FROM respool.policies WHERE subject = 'prod'")
    assert flips is True
    assert await events(conn, dev) == [
        (None, "queued", None),
        ("queued", "allocated", None),
        ("allocated", "preempted", "reclaim"),
    ]
    assert [e[1] for e in await events(conn, prod)] == ["queued", "allocated"]


async def test_update_sets_and_removes_windows(conn: asyncpg.Connection) -> None:
    now = utc("2026-03-27T17:00")  # Friday evening in Berlin
    await mk_pool(conn, "p", {"gpu": 8})
    pol = await policy(conn, "prod", now, reserved={"gpu": 6}, windows=OFFICE)
    assert (pol.active, pol.next_change) == (False, utc("2026-03-30T07:00"))
    kept = await update(conn, pol.id, now, priority=3, windows=None)  # SQL NULL keeps them
    assert (kept.windows, kept.active, kept.priority) == (pol.windows, False, 3)
    always = await update(conn, pol.id, now, windows=REMOVE)  # JSON null removes them
    assert (always.windows, always.active, always.next_change) == (None, True, None)
    assert (
        await conn.fetchval("SELECT reserved FROM respool.policy_resources WHERE key = 'gpu'") == 6
    )  # in force
    again = await update(conn, pol.id, now, windows=OFFICE)
    assert (again.active, again.reserved) == (False, {"gpu": 6})
    assert (
        await conn.fetchval("SELECT reserved FROM respool.policy_resources WHERE key = 'gpu'") == 0
    )  # not in force outside the window


# --- pattern subjects ---------------------------------------------------------------------------


async def test_patterns_with_one_literal_prefix_tie(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 8})
    await mk_pool(conn, "q", {"gpu": 8})
    now = utc("2026-01-05T00:00")
    team = await policy(conn, "team-vision:*", now)
    assert team.covers == []
    with pytest.raises(Conflict) as err:
        await policy(conn, "team-vision:*-gpu", now)
    assert err.value.field == "subject"
    assert "team-vision:*" in err.value.message and "'team-vision:'" in err.value.message
    await policy(conn, "team-vision:*", now, pool="q")  # another pool
    await policy(conn, "team-vision:a*", now)  # a longer prefix
    await policy(conn, "team-vision:", now)  # an exact subject
    with pytest.raises(BadInput):
        await policy(conn, "*bad subject", now)
    subjects = [p.subject for p in await db_policies.list_policies(conn, subject="team-vision:*")]
    assert subjects == ["team-vision:*", "team-vision:*"]
    # Exact text only: a subject a pattern covers does not find the pattern.
    assert await db_policies.list_policies(conn, subject="team-vision:x") == []


async def test_non_preemptible_work_outside_its_window_waits_for_it(
    conn: asyncpg.Connection,
) -> None:
    t0, _dev, _prod = await _borrowed_pool(conn)
    steady = await mk_req(conn, "prod", "p", resources={"gpu": 1}, preemptible=False)
    assert steady.status == "queued"
    await boundary_pass(conn, "p", t0 + timedelta(hours=1))
    assert await status(conn, steady.id) == "allocated"


async def test_non_preemptible_work_keeps_its_units_when_the_window_closes(
    conn: asyncpg.Connection,
) -> None:
    t0 = await conn.fetchval("SELECT now()")
    window = [{"start": t0.isoformat(), "end": (t0 + timedelta(hours=1)).isoformat()}]
    await mk_pool(conn, "p", {"gpu": 4})
    await policy(conn, "prod", t0, reserved={"gpu": 2}, windows=window)
    steady = await mk_req(conn, "prod", "p", resources={"gpu": 2}, preemptible=False)
    assert steady.status == "allocated"
    flipped, _ = await boundary_pass(conn, "p", t0 + timedelta(hours=1))
    assert flipped == 1
    assert await status(conn, steady.id) == "allocated"  # never a victim
    assert (await get_policy(conn, "prod")).borrowed == {"gpu": 2}
    assert await db_reconcile.invariant_violations(conn) == []


async def test_a_pattern_covers_the_subjects_holding_or_queued_through_it(
    conn: asyncpg.Connection,
) -> None:
    now = await conn.fetchval("SELECT now()")
    await mk_pool(conn, "p", {"gpu": 2})
    await policy(conn, "team-vision:*", now, limit={"gpu": 2})
    await policy(conn, "team-vision:carol", now)
    bob = await mk_req(conn, "team-vision:bob", "p", resources={"gpu": 2})
    alice = await mk_req(conn, "team-vision:alice", "p", resources={"gpu": 1})
    carol = await mk_req(conn, "team-vision:carol", "p", resources={"gpu": 1})
    assert [bob.status, alice.status, carol.status] == ["allocated", "queued", "queued"]
    team = await get_policy(conn, "team-vision:*")
    assert team.covers == ["team-vision:alice", "team-vision:bob"]  # carol has her own policy
    assert (await get_policy(conn, "team-vision:carol")).covers == []
    await db_requests.release_request(conn, bob.id)
    assert (await get_policy(conn, "team-vision:*")).covers == ["team-vision:alice"]
