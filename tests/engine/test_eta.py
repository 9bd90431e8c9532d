"""ETA (docs/scheduling.md): a queued request's ``eta`` from the pool's recorded hold times
and the queue ahead of it, conditioned on how long the holders have held so far; none from
fewer than ten recorded holds (its calibration on a replayed trace is a benchmark:
``python -m bench eta``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

import asyncpg
from engine_support import create_at, db_now, get, mk_policy, mk_pool, release_at

from app.db import requests as db_requests


async def create(conn: asyncpg.Connection, gpu: int, at: datetime) -> UUID:
    return UUID((await create_at(conn, "s", "p", {"gpu": gpu}, at))["id"])


async def record_holds(conn: asyncpg.Connection, start: datetime, *holds: float) -> None:
    """Recorded holds of these lengths (seconds) in pool ``p``, one after another from
    ``start``."""
    t = start
    for hold in holds:
        r = await create(conn, 1, t)
        await release_at(conn, r, t + timedelta(seconds=hold))
        t += timedelta(seconds=hold + 1)


async def eta_at(conn: asyncpg.Connection, request_id: UUID, now: datetime) -> tuple[int, int]:
    """The request's ETA as the engine would show it at ``now`` (the engine's p_now)."""
    eta = await conn.fetchval("SELECT respool._request_eta($1, $2)", request_id, now)
    assert eta is not None, now
    return eta["p50_seconds"], eta["p90_seconds"]


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
    for i in range(10):  # history: holds of 100 s (ten: the fewest an ETA is drawn from)
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


async def test_a_holder_past_every_recorded_hold_moves_the_eta_as_it_ages(
    conn: asyncpg.Connection,
) -> None:
    """Recorded holds of about 2 s; the pool's holder has held 10, 18, then 26 s: the estimate
    grows with its age (it used to stay at ``~2s (90%: within 2s)``)."""
    await mk_pool(conn, "p", {"gpu": 1}, starvation_seconds=None)
    await mk_policy(conn, "s", "p")
    now = await db_now(conn)
    await record_holds(conn, now - timedelta(hours=1), *([2.0] * 10))
    started = now - timedelta(seconds=60)
    holder = await create(conn, 1, started)
    waiting = await create(conn, 1, started + timedelta(seconds=1))
    assert (await get(conn, holder)).status == "allocated"
    assert (await get(conn, waiting)).status == "queued"

    seen = [await eta_at(conn, waiting, started + timedelta(seconds=age)) for age in (10, 18, 26)]
    p50s = [p50 for p50, _ in seen]
    p90s = [p90 for _, p90 in seen]
    assert p50s == sorted(p50s) and len(set(p50s)) == 3, seen
    assert p90s == sorted(p90s) and len(set(p90s)) == 3, seen
    for age, (p50, p90) in zip((10, 18, 26), seen, strict=True):
        # Having held `age` seconds, at the median it holds about as long again, and the p90
        # claims far less certainty than the 2 s the record alone would say.
        assert age <= p50 <= age + 1, seen
        assert p90 >= 5 * p50, seen


async def test_outliving_all_but_a_few_recorded_holds_does_not_shrink_the_estimate(
    conn: asyncpg.Connection,
) -> None:
    """Ten holds of 10 s and one of 100 s: a holder at 50 s, then 90 s, is not expected to
    end sooner and sooner because the one longer record ends at 100 s."""
    await mk_pool(conn, "p", {"gpu": 1}, starvation_seconds=None)
    await mk_policy(conn, "s", "p")
    now = await db_now(conn)
    await record_holds(conn, now - timedelta(hours=1), *([10.0] * 10), 100.0)
    started = now - timedelta(seconds=200)
    await create(conn, 1, started)
    waiting = await create(conn, 1, started + timedelta(seconds=1))
    p50_at_50, p90_at_50 = await eta_at(conn, waiting, started + timedelta(seconds=50))
    p50_at_90, p90_at_90 = await eta_at(conn, waiting, started + timedelta(seconds=90))
    assert p50_at_50 >= 50 and p50_at_90 >= 90  # (it said 50 s, then 10 s)
    assert p90_at_90 > p90_at_50 > p50_at_50


async def test_a_young_holder_still_ends_after_the_typical_longer_hold(
    conn: asyncpg.Connection,
) -> None:
    """While ten or more recorded holds are longer than a holder's age, its estimate is theirs."""
    await mk_pool(conn, "p", {"gpu": 1}, starvation_seconds=None)
    await mk_policy(conn, "s", "p")
    now = await db_now(conn)
    await record_holds(conn, now - timedelta(hours=2), *([100.0] * 10), *([300.0] * 10))
    started = now - timedelta(seconds=20)
    await create(conn, 1, started)
    waiting = await create(conn, 1, started + timedelta(seconds=1))
    # At 20 s all twenty are longer: median 100 s, 90th percentile 300 s, so 80 s and 280 s left.
    assert await eta_at(conn, waiting, started + timedelta(seconds=20)) == (80, 280)
    # At 150 s only the ten 300 s holds are longer: 150 s left, whatever the quantile.
    assert await eta_at(conn, waiting, started + timedelta(seconds=150)) == (150, 150)


async def test_fewer_than_ten_recorded_holds_give_no_eta(conn: asyncpg.Connection) -> None:
    """Two (or nine) recorded holds make no p50 or p90 claim: eta is null until the tenth."""
    await mk_pool(conn, "p", {"gpu": 1}, starvation_seconds=None)
    await mk_policy(conn, "s", "p")
    now = await db_now(conn)

    async def probe(at: datetime) -> tuple[UUID, UUID]:
        """A holder from ``at`` and a request queued behind it."""
        holder = await create(conn, 1, at)
        waiting = await create(conn, 1, at + timedelta(seconds=1))
        assert (await get(conn, waiting)).status == "queued"
        return holder, waiting

    await record_holds(conn, now - timedelta(hours=1), 2.0, 2.0)
    holder, waiting = await probe(now - timedelta(seconds=100))
    assert (await get(conn, waiting)).eta is None  # two recorded holds: no claim
    row = await conn.fetchrow(
        "SELECT eta_p50_seconds, eta_p90_seconds FROM respool.queue WHERE request_id = $1",
        waiting,
    )
    assert row is not None and row["eta_p50_seconds"] is None and row["eta_p90_seconds"] is None
    await conn.execute("SELECT respool.cancel_request($1)", waiting)
    await release_at(conn, holder, now - timedelta(seconds=90))  # the third
    await record_holds(conn, now - timedelta(seconds=80), *([1.0] * 6))  # nine
    holder, waiting = await probe(now - timedelta(seconds=60))
    assert (await get(conn, waiting)).eta is None
    await conn.execute("SELECT respool.cancel_request($1)", waiting)
    await release_at(conn, holder, now - timedelta(seconds=50))  # the tenth
    holder, waiting = await probe(now - timedelta(seconds=40))
    eta = (await get(conn, waiting)).eta
    assert eta is not None and eta.p90_seconds >= eta.p50_seconds
