"""ETA (docs/scheduling.md): a holder ends at the quantile of the recorded holds longer than
its age so far.
``respool._quantile_above`` finds those holds by binary search; it must pick exactly what
filtering and sorting them (``_quantile`` of ``{d - age : d > age}``) picks."""

from __future__ import annotations

import random

import asyncpg


async def test_quantile_above_is_the_quantile_of_the_longer_holds(conn: asyncpg.Connection) -> None:
    rng = random.Random(15)
    cases = []
    for _ in range(300):
        hist = sorted(
            float(rng.choice([rng.randint(1, 50), rng.uniform(0, 600)]))
            for _ in range(rng.randint(1, 40))
        )
        age = rng.choice([0.0, rng.uniform(0, 700), rng.choice(hist), hist[-1], hist[0] - 1])
        cases.append((hist, age, rng.choice([0.5, 0.9, 0.01, 1.0])))
    got = []
    for hist, age, q in cases:
        row = await conn.fetchrow(
            "SELECT respool._quantile_above($1, $2, $3) AS fast,"
            " respool._quantile((SELECT array_agg(d - $2 ORDER BY d) FROM unnest($1::float8[]) d"
            "                    WHERE d > $2), $3) AS slow",
            hist,
            age,
            q,
        )
        assert row is not None
        assert row["fast"] == row["slow"], (hist, age, q)
        got.append(row["fast"])
    assert None in got and any(g is not None for g in got)


async def test_remaining_hold_is_the_longer_holds_or_a_tail_that_grows_with_the_age(
    conn: asyncpg.Connection,
) -> None:
    """``respool._remaining_hold``: with at least ``_eta_min_holds()`` (10) recorded holds
    longer than the age, exactly ``_quantile_above``; with fewer, at least the age times
    ``1 / (1 - q) - 1`` (the age at the median, nine times it at the 90th percentile) and at
    least what those few say; past every recorded hold it grows with the age."""
    assert await conn.fetchval("SELECT respool._eta_min_holds()") == 10
    rng = random.Random(27)
    for _ in range(200):
        hist = sorted(rng.uniform(1, 600) for _ in range(rng.randint(10, 40)))
        age = rng.choice([0.0, rng.uniform(0, 700), rng.choice(hist), hist[-1], hist[-1] * 3])
        q = rng.choice([0.5, 0.9])
        row = await conn.fetchrow(
            "SELECT respool._remaining_hold($1, $2, $3) AS rem,"
            " respool._quantile_above($1, $2, $3) AS emp",
            hist,
            age,
            q,
        )
        assert row is not None
        longer = sum(d > age for d in hist)
        if longer >= 10:
            assert row["rem"] == row["emp"], (hist, age, q)
        else:
            assert row["rem"] >= age * (1 / (1 - q) - 1) - 1e-9, (hist, age, q)
            assert row["rem"] >= (row["emp"] or 0), (hist, age, q)
    hist = [2.0] * 10
    tail = [
        await conn.fetchval("SELECT respool._remaining_hold($1, $2, 0.5)", hist, age)
        for age in (2.0, 10.0, 18.0, 26.0)
    ]
    assert tail == [2.0, 10.0, 18.0, 26.0]
