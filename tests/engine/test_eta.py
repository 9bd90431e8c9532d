"""ETA (docs/scheduling.md): a queued request's ``eta`` from the pool's recorded hold times
and the queue ahead of it (its accuracy on a replayed trace is a benchmark:
``python -m bench eta``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

import asyncpg
from engine_support import create_at, db_now, get, mk_policy, mk_pool, release_at

from app.db import requests as db_requests


async def create(conn: asyncpg.Connection, gpu: int, at: datetime) -> UUID:
    return UUID((await create_at(conn, "s", "p", {"gpu": gpu}, at))["id"])


async def test_no_history_no_eta_then_estimates_from_hold_times(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 1}, starvation_seconds=None)
    await mk_policy(conn, "s", "p")
    now = await db_now(conn)
    holder = await create(conn, 1, now - timedelta(seconds=30))
    first = await create(conn, 1, now - timedelta(seconds=20))
    assert (await get(conn, first)).eta is None  # no hold recorded yet in this pool
    await release_at(conn, holder, now - timedelta(seconds=10))
    # History: one hold of 20 s ... build ten holds of 100 s (and one of 1000 s) in the past.
    await release_at(conn, first, now - timedelta(seconds=9))
    start = now - timedelta(hours=3)
    for i in range(10):
        r = await create(conn, 1, start + timedelta(seconds=200 * i))
        await release_at(conn, r, start + timedelta(seconds=200 * i + 100))
    long = await create(conn, 1, start + timedelta(seconds=5000))
    await release_at(conn, long, start + timedelta(seconds=6000))
    # A holder that started 30 s ago, and two requests queued behind it.
    running = await create(conn, 1, now - timedelta(seconds=30))
    assert (await get(conn, running)).status == "allocated"
    next_one = await create(conn, 1, now - timedelta(seconds=5))
    after = await create(conn, 1, now - timedelta(seconds=4))
    eta1 = (await get(conn, next_one)).eta
    eta2 = (await get(conn, after)).eta
    assert eta1 is not None and eta2 is not None
    # The holder has run 30 s of a typical 100 s hold: about 70 s left at the median.
    assert 60 <= eta1.p50_seconds <= 75
    assert eta1.p90_seconds >= eta1.p50_seconds
    # The second waits for the first's whole hold too (about 100 s more at the median).
    assert 150 <= eta2.p50_seconds <= 180
    assert eta2.p90_seconds >= eta2.p50_seconds
    rows = await conn.fetch(
        "SELECT request_id, eta_p50_seconds, eta_p90_seconds FROM respool.queue"
        " WHERE pool = 'p' ORDER BY position"
    )
    assert [r["request_id"] for r in rows] == [next_one, after]
    assert abs(rows[0]["eta_p50_seconds"] - eta1.p50_seconds) <= 2
    # Not queued: no eta.
    assert (await db_requests.get_request(conn, running)).eta is None


async def test_eta_with_several_tracked_keys(conn: asyncpg.Connection) -> None:
    """Units are counted per tracked key: a request waits for the holder of the key it needs."""
    await mk_pool(conn, "p", {"gpu": 1, "tpu": 1}, starvation_seconds=None)
    await mk_policy(conn, "s", "p")
    now = await db_now(conn)
    start = now - timedelta(hours=1)
    for i in range(5):  # history: holds of 100 s
        r = await create(conn, 1, start + timedelta(seconds=200 * i))
        await release_at(conn, r, start + timedelta(seconds=200 * i + 100))
    await create(conn, 1, now - timedelta(seconds=50))  # holds the GPU, 50 s of ~100 left
    tpu = await conn.fetchval(
        "SELECT request FROM respool.create_request("
        '\'{"subject": "s", "pool": "p", "resources": {"tpu": 1}}\', p_now => $1)',
        now - timedelta(seconds=40),
    )
    assert tpu["status"] == "allocated"
    waiting = await create(conn, 1, now - timedelta(seconds=5))
    eta = (await get(conn, waiting)).eta
    assert eta is not None and 45 <= eta.p50_seconds <= 55
    rows = await conn.fetch("SELECT request_id FROM respool.queue WHERE pool = 'p'")
    assert [r["request_id"] for r in rows] == [waiting]
