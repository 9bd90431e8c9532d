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
