"""The capacity model's count agrees with its fit (docs/engine.md, "The capacity model").

``respool._fit_count`` says how many requests of one shape fit a pool and a subject's bounds
together, by division over the rooms; ``respool._fits`` tests one need. For k requests of one
shape to fit together is for one request of k times the need to fit, so the count must be the
largest k whose scaled need the fit test admits, whatever the counters hold.
"""

from __future__ import annotations

import asyncpg
import engine_support as es
import pytest

SCALED_FITS = """
SELECT respool._fits((SELECT jsonb_object_agg(x.key, x.value::bigint * $1)
                        FROM jsonb_each_text($2::jsonb) x),
                     $3, $4, $5, NULL, NULL, NULL)
"""


async def _largest_fitting(
    conn: asyncpg.Connection, need: dict[str, int], preemptible: bool, pool: object, policy: object
) -> int:
    k = 0
    while k < 40 and await conn.fetchval(SCALED_FITS, k + 1, need, preemptible, pool, policy):
        k += 1
    return k


@pytest.mark.parametrize("preemptible", [True, False])
async def test_the_count_by_division_is_the_largest_k_the_fit_admits(
    conn: asyncpg.Connection, preemptible: bool
) -> None:
    await es.mk_pool(conn, "p", {"gpu": 10, "slot": 7})
    await es.mk_policy(conn, "S", "p", reserved={"gpu": 3}, limit={"gpu": 8})
    await es.mk_policy(conn, "T", "p")
    pool = await es.pool_id(conn, "p")
    policy = await conn.fetchval(
        "SELECT id FROM respool.policies WHERE subject = 'S' AND pool_id = $1", pool
    )
    needs = [{"gpu": 1}, {"gpu": 2, "slot": 1}, {"gpu": 1, "mcpu": 500}, {"slot": 2}, {"mcpu": 1}]
    # The counters move between checks: another subject's use, the subject's own, a full key.
    for holder, held in [
        (None, None),
        ("T", {"gpu": 3}),
        ("S", {"gpu": 2, "slot": 2}),
        ("T", {"slot": 5}),
    ]:
        if holder is not None:
            assert (await es.mk_req(conn, holder, "p", resources=held)).status == "allocated"
        for need in needs:
            count = await conn.fetchval(
                "SELECT respool._fit_count($1::jsonb, $2, $3, $4)", need, preemptible, pool, policy
            )
            largest = await _largest_fitting(conn, need, preemptible, pool, policy)
            assert count == min(largest, await conn.fetchval("SELECT respool._max_batch()")) or (
                largest == 40 and count >= 40
            ), (holder, held, need, count, largest)
