"""The placement seam is the only path (docs/engine.md, "The placement seam").

Every grant asks ``respool._fit_node`` whether (and on which node) it fits, places through
``respool._place`` and gives its units back through ``respool._unplace``. These tests replace the
seam's functions inside the test's own database (as the broken twins of ``support.twins`` do)
and check that every grant path obeys the replacement: if a path kept its own fit test or its
own counter arithmetic, it would grant past a ``_fit_node`` that refuses everything, or grant /
give back units the recording seam never saw.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import asyncpg
import engine_support as es
import pytest

from app.db import requests as db_requests

FITS = "respool._fit_node(jsonb, boolean, uuid, uuid, uuid, uuid, jsonb)"
PLACE = "respool._place(uuid, uuid, respool.requests[], uuid[])"
UNPLACE = "respool._unplace(uuid, boolean)"


async def _replace(conn: asyncpg.Connection, function: str, old: str, new: str) -> None:
    """Re-create ``function`` with ``old`` (found once in its source) replaced by ``new``."""
    source = await conn.fetchval("SELECT pg_get_functiondef($1::regprocedure)", function)
    assert source.count(old) == 1, f"{old!r} not found once in {function}"
    await conn.execute(source.replace(old, new))


async def _refuse_everything(conn: asyncpg.Connection) -> None:
    await _replace(conn, FITS, "fits := respool._blocker(", "fits := false AND respool._blocker(")


async def _dev_and_prod(conn: asyncpg.Connection) -> None:
    """Pool p of 4 GPUs; prod holds a reserved share of all 4, dev borrows."""
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "prod", "p", reserved={"gpu": 4})
    await es.mk_policy(conn, "dev", "p")


async def test_a_fit_test_that_refuses_everything_stops_create_and_the_pass(
    conn: asyncpg.Connection,
) -> None:
    await _dev_and_prod(conn)
    await _refuse_everything(conn)
    # create: an empty pool, yet the new request waits (the at-once grant asked the seam).
    first = await es.mk_req(conn, "dev", "p", resources={"gpu": 1})
    assert first.status == "queued"
    # The pass: three of one shape (the set-based run) and one of another (one-request path).
    more = [(await es.mk_req(conn, "dev", "p", resources={"gpu": 1})).id for _ in range(3)]
    other = await es.mk_req(conn, "dev", "p", resources={"gpu": 2})
    assert await es.reconcile(conn, "p") is not None
    pool = await es.pool_id(conn, "p")
    assert await conn.fetchval("SELECT respool.allocate_pool($1)", pool) == 0
    assert await es.statuses(conn, first.id, *more, other.id) == ["queued"] * 5
    assert await es.allocated(conn, "p") == {}


async def test_preemption_for_the_queue_grants_only_what_the_fit_test_admits(
    conn: asyncpg.Connection,
) -> None:
    await _dev_and_prod(conn)
    borrower = await es.mk_req(conn, "dev", "p", resources={"gpu": 4})
    assert borrower.status == "allocated"
    await _refuse_everything(conn)
    owner = await es.mk_req(conn, "prod", "p", resources={"gpu": 2})
    assert owner.status == "queued"
    # Reclaim frees the borrower's GPUs for prod, but the grant still asks the seam: refused, the
    # pass stops with an internal error rather than grant past it, and nothing of it stays.
    with pytest.raises(asyncpg.PostgresError, match="does not fit after preempting"):
        async with conn.transaction():
            await es.reconcile(conn, "p")
    assert await es.statuses(conn, borrower.id, owner.id) == ["allocated", "queued"]


async def _record_placements(conn: asyncpg.Connection) -> None:
    """A seam that records each placement and each give-back, as a node feature would."""
    await conn.execute("CREATE TEMP TABLE placed (request_id uuid NOT NULL)")
    await conn.execute("CREATE TEMP TABLE unplaced (request_id uuid NOT NULL)")
    await _replace(
        conn,
        PLACE,
        "    IF NOT respool._pool_has_nodes(p_pool_id) THEN",
        "    INSERT INTO pg_temp.placed SELECT (g).id FROM unnest(p_granted) g;\n"
        "    IF NOT respool._pool_has_nodes(p_pool_id) THEN",
    )
    await _replace(
        conn,
        UNPLACE,
        "    v_doc := respool._placement_json(p_request_id);",
        "    INSERT INTO pg_temp.unplaced VALUES (p_request_id);\n"
        "    v_doc := respool._placement_json(p_request_id);",
    )


_COUNTS = {
    "placed": "SELECT request_id, count(*) AS n FROM pg_temp.placed GROUP BY 1",
    "unplaced": "SELECT request_id, count(*) AS n FROM pg_temp.unplaced GROUP BY 1",
}


async def _count(conn: asyncpg.Connection, table: str) -> dict[UUID, int]:
    rows = await conn.fetch(_COUNTS[table])
    return {r["request_id"]: r["n"] for r in rows}


async def _history_counts(conn: asyncpg.Connection) -> tuple[dict[UUID, int], dict[UUID, int]]:
    """Per request: how often it was granted, and how often it gave units back, by its events."""
    rows = await conn.fetch(
        """
        SELECT request_id,
               count(*) FILTER (WHERE to_status = 'allocated') AS granted,
               count(*) FILTER (WHERE from_status IN ('allocated', 'preempting')
                                  AND to_status NOT IN ('preempting', 'allocated')) AS returned
          FROM respool.request_events GROUP BY 1
        """
    )
    granted = {r["request_id"]: r["granted"] for r in rows if r["granted"]}
    returned = {r["request_id"]: r["returned"] for r in rows if r["returned"]}
    return granted, returned


async def test_every_grant_is_placed_and_every_give_back_unplaced(
    conn: asyncpg.Connection,
) -> None:
    await _dev_and_prod(conn)
    await _record_placements(conn)
    released = await es.mk_req(conn, "dev", "p", resources={"gpu": 4})  # granted at create
    waiting = [(await es.mk_req(conn, "dev", "p", resources={"gpu": 1})).id for _ in range(4)]
    await db_requests.release_request(conn, released.id)  # a set-based run of four
    assert await es.statuses(conn, *waiting) == ["allocated"] * 4
    await db_requests.cancel_request(conn, waiting[0])  # cancel gives back
    owner = await es.mk_req(conn, "prod", "p", resources={"gpu": 4})
    await es.reconcile(conn, "p")  # reclaim: preemption gives back, prod is granted
    assert await es.status(conn, owner.id) == "allocated"
    lapsing = await es.mk_req(conn, "dev", "p", resources={"gpu": 1}, lease_seconds=10)
    await db_requests.release_request(conn, owner.id)
    assert await es.status(conn, lapsing.id) == "allocated"
    await es.reconcile(conn, "p", await conn.fetchval("SELECT now()") + timedelta(seconds=60))
    assert await es.status(conn, lapsing.id) == "expired"  # expiry gives back
    granted, returned = await _history_counts(conn)
    assert await _count(conn, "placed") == granted
    assert await _count(conn, "unplaced") == returned
    assert len(granted) >= 6 and len(returned) >= 5
    await es.assert_healthy(conn)
