"""The policy-shape columns of ``respool.policy_usage``, the view ``respool.policy_subjects``,
I3 against the share as set, and the ``respool_policy_active`` / ``respool_policy_covered_subjects``
gauges (docs/preemption.md, "Policy shapes"; docs/ops.md).

Everything goes through the engine: a policy whose window closed after it was granted work
(share in force 0, share as set kept), a priority lane, and a team quota ``team-vision:*`` that
three subjects hold and wait through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from app.db import metrics as db_metrics
from support.db import assert_refused, direct
from support.server import running_server

from .test_metrics import get, scrape


async def _request(conn: asyncpg.Connection, subject: str, resources: dict[str, int],
                   preemptible: bool = True) -> dict[str, Any]:  # fmt: skip
    made: dict[str, Any] = await conn.fetchval(
        "SELECT (respool.create_request($1)).request",
        {"subject": subject, "pool": "gpus", "resources": resources, "preemptible": preemptible},
    )
    return made


async def _policy(
    conn: asyncpg.Connection, subject: str, lane: bool = False, windows: Any = None,
    **maps: dict[str, int],
) -> None:  # fmt: skip
    await conn.execute(
        "SELECT respool.create_policy(p_subject => $1, p_pool => 'gpus', p_reserved => $2,"
        " p_limit => $3, p_priority_lane => $4, p_windows => $5)",
        subject,
        maps.get("reserved", {}),
        maps.get("limit", {}),
        lane,
        windows,
    )


async def boundary_pass(conn: asyncpg.Connection, at: datetime) -> None:
    """The reconciler's pass at ``at``: it applies the window boundaries due first."""
    await conn.execute(
        "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = 'gpus'), $1)",
        at,
    )


async def _build(conn: asyncpg.Connection) -> dict[str, UUID]:
    """Pool ``gpus`` (16 gpu). ``prod`` (reserved 6, limit 8, one window: the hour around now)
    holds 2 non-preemptible and 1 preemptible gpu; then a pass two hours later closes its
    window. ``oncall`` is a priority lane holding 1. The team quota ``team-vision:*``
    (reserved 4, limit 12) covers ``team-vision:a`` (holds 2), ``team-vision:b`` (holds 3, waits
    for 12) and ``team-vision:c`` (waits for 10); ``solo`` (no pattern) holds 1."""
    now: datetime = await conn.fetchval("SELECT now()")
    hour = timedelta(hours=1)
    await conn.execute("SELECT respool.create_pool(p_name => 'gpus', p_capacity => $1)",
                       {"gpu": 16})  # fmt: skip
    window = [{"start": (now - hour).isoformat(), "end": (now + hour).isoformat()}]
    await _policy(conn, "prod", windows=window, reserved={"gpu": 6}, limit={"gpu": 8})
    await _policy(conn, "oncall", lane=True)
    await _policy(conn, "solo")
    # One quota for the team: the engine charges every team-vision:... request to it.
    await _policy(conn, "team-vision:*", reserved={"gpu": 4}, limit={"gpu": 12})
    out: dict[str, UUID] = {}
    plan = [
        ("prod_np", "prod", 2, False),
        ("prod_p", "prod", 1, True),
        ("oncall", "oncall", 1, True),
        ("solo", "solo", 1, True),
        ("a", "team-vision:a", 2, True),
        ("b", "team-vision:b", 3, True),
        ("b_wait", "team-vision:b", 12, True),
        ("c_wait", "team-vision:c", 10, True),
    ]
    for name, subject, gpu, preemptible in plan:
        made = await _request(conn, subject, {"gpu": gpu}, preemptible)
        assert made["status"] == ("queued" if name.endswith("_wait") else "allocated"), name
        out[name] = UUID(made["id"])
    await boundary_pass(conn, now + 2 * hour)
    return out


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[tuple[asyncpg.Connection, dict[str, UUID]]]:
    async with direct(db_url) as conn:
        ids = await _build(conn)
        yield conn, ids


async def _usage(conn: asyncpg.Connection) -> dict[str, tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT subject, reserved, configured, active, priority_lane, used, borrowed, np_used,"
        " \"limit\" FROM respool.policy_usage WHERE key = 'gpu'"
    )
    return {r["subject"]: tuple(r)[1:] for r in rows}


async def test_policy_usage_shows_the_share_in_force_and_the_share_as_set(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    conn, _ = db
    usage = await _usage(conn)
    # subject: reserved (in force), configured, active, priority_lane, used, borrowed, np, limit
    assert usage["prod"] == (0, 6, False, False, 3, 3, 2, 8)
    assert usage["oncall"] == (0, 0, True, True, 1, 1, 0, None)
    # The team's counters are the sums over its subjects: 2 + 3 held, 1 above its share of 4.
    assert usage["team-vision:*"] == (4, 4, True, False, 5, 1, 0, 12)
    assert usage["solo"][:5] == (0, 0, True, False, 1)
    # The columns every earlier reader uses are still there, first and in their order.
    cols = [
        r["column_name"]
        for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'respool' AND table_name = 'policy_usage'"
            " ORDER BY ordinal_position"
        )
    ]
    assert cols == [
        "pool", "subject", "key", "priority", "reserved", "limit", "used", "borrowed", "np_used",
        "configured", "active", "priority_lane",
    ]  # fmt: skip


async def test_borrowed_follows_the_window(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    """When a window opens again the share in force is the share as set: nothing borrowed."""
    conn, _ = db
    now: datetime = await conn.fetchval("SELECT now()")
    later = [{"start": now.isoformat(), "end": (now + timedelta(days=1)).isoformat()}]
    await conn.execute(
        "SELECT respool.update_policy(p_ref => (SELECT id::text FROM respool.policies"
        " WHERE subject = 'prod'), p_windows => $1, p_now => $2)",
        later,
        now + timedelta(hours=3),
    )
    assert (await _usage(conn))["prod"] == (6, 6, True, False, 3, 0, 2, 8)
    pools = {r.key: r for r in await db_metrics.pool_key_rows(conn)}
    assert (pools["gpu"].reserved, pools["gpu"].borrowed) == (10, 3)  # prod 6 + team 4; 1+1+1


_GPU_SUBJECTS = "SELECT * FROM respool.policy_subjects WHERE key = 'gpu'"


async def test_policy_subjects_lists_who_a_pattern_covers(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    conn, ids = db
    rows = [tuple(r) for r in await conn.fetch(_GPU_SUBJECTS)]
    assert rows == [
        ("gpus", "team-vision:*", "team-vision:a", "gpu", 2, 0),
        ("gpus", "team-vision:*", "team-vision:b", "gpu", 3, 12),
        ("gpus", "team-vision:*", "team-vision:c", "gpu", 0, 10),
    ]
    # The pattern's counter is the sum of what its subjects hold.
    assert sum(r[4] for r in rows) == (await _usage(conn))["team-vision:*"][4]
    # A subject that holds and waits for nothing is no longer covered; one that still waits is.
    await conn.execute("SELECT respool.release_request(p_id => $1)", ids["a"])
    await conn.execute("SELECT respool.release_request(p_id => $1)", ids["b"])
    await conn.execute("SELECT respool.cancel_request(p_id => $1)", ids["c_wait"])
    rows = [tuple(r) for r in await conn.fetch(_GPU_SUBJECTS)]
    assert [r[2:] for r in rows if r[2] != "team-vision:b"] == []
    [b] = [r for r in rows if r[2] == "team-vision:b"]
    # b's 12 GPUs still do not fit once a and b released (16 - 5 held = 11 free), so b is
    # covered through its queued request only.
    assert b == ("gpus", "team-vision:*", "team-vision:b", "gpu", 0, 12)


async def test_a_request_without_units_is_covered_with_key_null(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    conn, ids = db
    await conn.execute("UPDATE respool.requests SET resources = '{}' WHERE id = $1", ids["c_wait"])
    await conn.execute(
        "UPDATE respool.queue_entries SET resources = '{}' WHERE request_id = $1", ids["c_wait"]
    )
    rows = await conn.fetch(
        "SELECT key, used, queued FROM respool.policy_subjects WHERE subject = 'team-vision:c'"
    )
    assert [tuple(r) for r in rows] == [(None, 0, 0)]


async def test_i3_compares_non_preemptible_units_with_the_share_as_set(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    """prod keeps its 2 non-preemptible GPUs outside its window (share in force 0): no I3.
    Charged 7 against a share as set of 6: I3 (and I4, its counter is not the held sum)."""
    conn, ids = db
    assert await conn.fetch("SELECT * FROM respool.invariant_violations") == []
    await conn.execute(
        "UPDATE respool.requests SET np_charge = '{\"gpu\": 7}', resources = '{\"gpu\": 7}'"
        " WHERE id = $1",
        ids["prod_np"],
    )
    rows = await conn.fetch(
        "SELECT invariant, subject, key, detail FROM respool.invariant_violations"
        " WHERE invariant = 'I3'"
    )
    assert [tuple(r) for r in rows] == [("I3", "prod", "gpu", "non-preemptible 7 > reserved 6")]


async def test_holdings_show_the_preemption_group(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    conn, ids = db
    await conn.execute(
        "UPDATE respool.requests SET preemption_group = 'run-42' WHERE id = $1", ids["a"]
    )
    rows = await conn.fetch(
        "SELECT request_id, preemption_group FROM respool.holdings"
        " WHERE preemption_group IS NOT NULL"
    )
    assert [tuple(r) for r in rows] == [(ids["a"], "run-42")]


async def test_the_reader_role_reads_the_shape_views(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    conn, _ = db
    role = await conn.fetchval("SELECT respool.ensure_reader_role()")
    await conn.execute(f'SET ROLE "{role}"')
    try:
        assert (
            await conn.fetchval("SELECT count(DISTINCT subject) FROM respool.policy_subjects") == 3
        )
        assert (
            await conn.fetchval(
                "SELECT count(DISTINCT subject) FROM respool.policy_usage"
                " WHERE NOT active OR priority_lane"
            )
            == 2
        )
        await assert_refused(conn, "SELECT windows FROM respool.policies LIMIT 1")
    finally:
        await conn.execute("RESET ROLE")


async def test_every_shape_view_has_a_comment(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    conn, _ = db
    comment = await conn.fetchval("SELECT obj_description('respool.policy_subjects'::regclass)")
    assert comment and "pattern" in comment


async def test_metrics_show_active_policies_and_covered_subjects(db_url: str) -> None:
    async with direct(db_url) as conn:
        await _build(conn)
        async with running_server(db_url, metrics_cache_seconds=0.0) as server:
            m = await scrape(server)
    assert get(m, "respool_policy_active", pool="gpus", subject="prod") == 0
    assert get(m, "respool_policy_active", pool="gpus", subject="oncall") == 1
    assert get(m, "respool_policy_active", pool="gpus", subject="team-vision:*") == 1
    assert get(m, "respool_policy_covered_subjects", pool="gpus", subject="team-vision:*") == 3
    # Only patterns cover subjects; an exact subject's policy has no such series.
    assert get(m, "respool_policy_covered_subjects", pool="gpus", subject="prod") is None
    # The per-policy reserved gauge is the share in force, as the engine uses it.
    assert get(m, "respool_policy_reserved", pool="gpus", subject="prod", key="gpu") == 0
    assert get(m, "respool_policy_borrowed", pool="gpus", subject="prod", key="gpu") == 3


def _ops_query(heading: str) -> str:
    """The SQL block under ``heading`` in docs/ops.md (the page's ready queries)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "ops.md").read_text()
    section = text.split(f"### {heading}\n", 1)[1]
    return section.split("```sql\n", 1)[1].split("```", 1)[0]


async def test_the_ready_query_for_a_team_quota_runs_as_documented(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    conn, _ = db
    rows = await conn.fetch(_ops_query("Who a team quota covers"))
    gpu = [(r["subject"], r["used"], r["queued"], r["team_share"], r["team_used"])
           for r in rows if r["key"] == "gpu"]  # fmt: skip
    assert gpu == [
        ("team-vision:b", 3, 12, 4, 5),
        ("team-vision:a", 2, 0, 4, 5),
        ("team-vision:c", 0, 10, 4, 5),
    ]


async def test_the_ready_query_for_borrowers_shows_the_closed_window(
    db: tuple[asyncpg.Connection, dict[str, UUID]],
) -> None:
    conn, _ = db
    rows = await conn.fetch(_ops_query("Who borrows"))
    prod = [tuple(r) for r in rows if r["subject"] == "prod" and r["key"] == "gpu"]
    # pool, subject, key, used, reserved (in force), configured, active, borrowed, priority
    assert prod == [("gpus", "prod", "gpu", 3, 0, 6, False, 3, 0)]
