"""No counter sum can overflow: an amount is at most 10^15 and a counter that no capacity or
limit bounds (an untracked soft key, a key without a limit) stops at respool._max_total()
(2^62), so counter + amount always fits in 64 bits (docs/api.md, "Numbers and bounds")."""

from __future__ import annotations

import asyncpg
from engine_support import mk_pool_s, mk_req


async def _near_ceiling(conn: asyncpg.Connection, key: str, *, table: str) -> None:
    """Put the pool's (or the policy's) counter of ``key`` 5 units under the ceiling, as many
    large holders would; the request rows are left alone (only the ceiling is under test)."""
    await conn.execute(
        f"UPDATE respool.{table} SET used = respool._max_total() - 5 WHERE key = $1",  # noqa: S608
        key,
    )


async def test_a_pool_counter_at_its_ceiling_makes_the_next_request_wait(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool_s(conn, {"gpu": 4})  # memory_mb untracked: no capacity bounds its counter
    await mk_req(conn, "S", "p", resources={"memory_mb": 10})
    await _near_ceiling(conn, "memory_mb", table="pool_resources")

    nxt = await mk_req(conn, "S", "p", resources={"memory_mb": 10})

    assert nxt.status == "queued"
    assert "the most one counter can hold" in nxt.message
    assert "memory_mb" in nxt.message
    # still no error for anyone else, and a request that stays under the ceiling is granted
    small = await mk_req(conn, "S", "p", resources={"memory_mb": 5})
    assert small.status == "allocated"


async def test_a_policy_counter_without_a_limit_stops_at_its_ceiling(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool_s(conn, {"gpu": 4})
    await mk_req(conn, "S", "p", resources={"mcpu": 1})  # the policy's mcpu counter, no limit
    await _near_ceiling(conn, "mcpu", table="policy_resources")  # the pool's counter stays low

    nxt = await mk_req(conn, "S", "p", resources={"mcpu": 10})

    assert nxt.status == "queued"
    assert "the most one counter can hold" in nxt.message


async def test_the_guarded_charge_refuses_to_pass_the_ceiling(conn: asyncpg.Connection) -> None:
    """The counter move itself is guarded too: a charge past the ceiling fails loudly (RP500)
    instead of overflowing, whatever a caller decided."""
    await mk_pool_s(conn, {"gpu": 4})
    made = await mk_req(conn, "S", "p", resources={"memory_mb": 10})
    await _near_ceiling(conn, "memory_mb", table="pool_resources")
    try:
        await conn.execute(
            "SELECT respool._move_units($1, $2, '{\"memory_mb\": 10}', '{}', 1)",
            made.pool_id,
            made.policy_id,
        )
    except asyncpg.PostgresError as exc:
        assert exc.sqlstate == "RP500"
    else:
        raise AssertionError("a charge past the ceiling was taken")
