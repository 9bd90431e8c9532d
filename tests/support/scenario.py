"""A scripted history for the ops tests, driven through the engine's SQL functions with explicit
clocks so that every duration (GPU-hours, waits) is known exactly.

Day 1 is 2025-03-01 (UTC). Pools: ``gpus`` {gpu: 8}, ``cpu`` {mcpu: 16000}, ``tiny`` {gpu: 1},
``grace`` {gpu: 2, grace 600 s}.

| id | subject | pool  | what happens                                                        |
|----|---------|-------|---------------------------------------------------------------------|
| b1 | team-b  | gpus  | gpu 6 at D1 22:00, preempted (reclaim) at D2 00:30 by a1            |
| a1 | team-a  | gpus  | gpu 4 queued D1 23:00, granted D2 00:30 (waited 5400 s), released 02:00 |
| b2 | team-b  | gpus  | gpu 2 at D2 01:00, released 05:00                                   |
| c1 | team-c  | cpu   | mcpu 4000 at D2 03:00, released 03:30                               |
| r1 | team-c  | gpus  | gpu 100 at D2 03:40: rejected (exceeds_capacity)                   |
| x1 | team-c  | gpus  | gpu 1, lease 60 s, at D2 04:00; expired by the reconciler at 04:05  |
| k1 | team-c  | gpus  | gpu 1 at D2 04:10, cancelled 04:20                                  |
| d1 | team-d  | tiny  | gpu 1 at D1 12:00, still allocated                                  |
| d2 | team-d  | tiny  | gpu 1 at D1 13:00, still queued                                     |
| e1 | team-e  | grace | gpu 2 at D1 10:00, preempting since D1 11:00 (for f1)               |
| f1 | team-f  | grace | gpu 2 queued at D1 11:00 (earmarked)                                |

``live()`` adds, at the real ``now()``: b3 (team-b, gpu 6, allocated) and c2 (team-c, gpu 4,
queued behind it: ``waiting for gpu: pool 6/8 used, needs 4``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import asyncpg

from support.db import reconcile

D1 = datetime(2025, 3, 1, tzinfo=UTC)
D2 = D1 + timedelta(days=1)


def at(day: datetime, hh: int, mm: int = 0) -> datetime:
    return day + timedelta(hours=hh, minutes=mm)


async def _create(
    conn: asyncpg.Connection,
    subject: str,
    pool: str,
    resources: dict[str, int],
    when: datetime | None = None,
    *,
    lease_seconds: int | None = None,
) -> UUID:
    rid: UUID = await conn.fetchval(
        "SELECT (request ->> 'id')::uuid FROM respool.create_request(jsonb_build_object("
        "'subject', $1::text, 'pool', $2::text, 'resources', $3::jsonb,"
        " 'lease_seconds', $5::integer), p_now => coalesce($4, now()))",
        subject,
        pool,
        resources,
        when,
        lease_seconds,
    )
    return rid


async def history(conn: asyncpg.Connection) -> dict[str, UUID]:
    """Build the table above; returns request ids by name."""
    ex = conn.execute
    await ex("SELECT respool.create_pool(p_name => 'gpus', p_capacity => '{\"gpu\": 8}')")
    await ex("SELECT respool.create_pool(p_name => 'cpu', p_capacity => '{\"mcpu\": 16000}')")
    await ex("SELECT respool.create_pool(p_name => 'tiny', p_capacity => '{\"gpu\": 1}')")
    await ex(
        "SELECT respool.create_pool(p_name => 'grace', p_capacity => '{\"gpu\": 2}',"
        " p_preemption_grace_seconds => 600)"
    )
    for subject, pool, extra in [
        ("team-a", "gpus", "p_priority => 10, p_reserved => '{\"gpu\": 4}'"),
        ("team-b", "gpus", "p_limit => '{\"gpu\": 8}'"),
        ("team-c", "gpus", "p_priority => 0"),
        ("team-c", "cpu", "p_reserved => '{\"mcpu\": 8000}'"),
        ("team-d", "tiny", "p_priority => 0"),
        ("team-e", "grace", "p_priority => 0"),
        ("team-f", "grace", "p_reserved => '{\"gpu\": 2}'"),
    ]:
        await ex(
            f"SELECT respool.create_policy(p_subject => '{subject}', p_pool => '{pool}', {extra})"
        )
    ids: dict[str, UUID] = {}
    release = "SELECT respool.release_request(p_id => $1, p_now => $2)"
    ids["d1"] = await _create(conn, "team-d", "tiny", {"gpu": 1}, at(D1, 12))
    ids["d2"] = await _create(conn, "team-d", "tiny", {"gpu": 1}, at(D1, 13))
    ids["e1"] = await _create(conn, "team-e", "grace", {"gpu": 2}, at(D1, 10))
    ids["f1"] = await _create(conn, "team-f", "grace", {"gpu": 2}, at(D1, 11))
    await reconcile(conn, "grace", at(D1, 11))
    ids["b1"] = await _create(conn, "team-b", "gpus", {"gpu": 6}, at(D1, 22))
    ids["a1"] = await _create(conn, "team-a", "gpus", {"gpu": 4}, at(D1, 23))
    await reconcile(conn, "gpus", at(D2, 0, 30))
    ids["b2"] = await _create(conn, "team-b", "gpus", {"gpu": 2}, at(D2, 1))
    await ex(release, ids["a1"], at(D2, 2))
    ids["c1"] = await _create(conn, "team-c", "cpu", {"mcpu": 4000}, at(D2, 3))
    await ex(release, ids["c1"], at(D2, 3, 30))
    ids["r1"] = await _create(conn, "team-c", "gpus", {"gpu": 100}, at(D2, 3, 40))
    ids["x1"] = await _create(conn, "team-c", "gpus", {"gpu": 1}, at(D2, 4), lease_seconds=60)
    await reconcile(conn, "gpus", at(D2, 4, 5))
    ids["k1"] = await _create(conn, "team-c", "gpus", {"gpu": 1}, at(D2, 4, 10))
    await ex("SELECT respool.cancel_request(p_id => $1, p_now => $2)", ids["k1"], at(D2, 4, 20))
    await ex(release, ids["b2"], at(D2, 5))
    return ids


async def live(conn: asyncpg.Connection) -> dict[str, UUID]:
    """b3 (allocated now) and c2 (queued now) on ``gpus``."""
    return {
        "b3": await _create(conn, "team-b", "gpus", {"gpu": 6}),
        "c2": await _create(conn, "team-c", "gpus", {"gpu": 4}),
    }


EXPECTED_STATUS = {
    "b1": "preempted", "a1": "released", "b2": "released", "c1": "released", "r1": "rejected",
    "x1": "expired", "k1": "cancelled", "d1": "allocated", "d2": "queued", "e1": "preempting",
    "f1": "queued",
}  # fmt: skip
