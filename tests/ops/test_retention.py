"""Retention: ``respool.prune_requests`` removes terminal requests older than the cutoff with
their events, and nothing else; ``POST /v1/retention/prune`` is its admin-only HTTP face."""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from app.db import ops as db_ops
from app.db import tokens
from app.db.connect import APP_CLI, connect
from app.db.errors import BadInput
from support import scenario
from support.scenario import D2, at
from support.server import running_server

TERMINAL = ["b1", "a1", "b2", "c1", "r1", "x1", "k1"]
LIVE = ["d1", "d2", "e1", "f1", "b3", "c2"]


@pytest.fixture
async def ids(conn: asyncpg.Connection) -> dict[str, UUID]:
    return await scenario.history(conn) | await scenario.live(conn)


async def _remaining(conn: asyncpg.Connection, ids: dict[str, UUID]) -> set[str]:
    present = {r["id"] for r in await conn.fetch("SELECT id FROM respool.requests")}
    return {name for name, rid in ids.items() if rid in present}


async def _events(conn: asyncpg.Connection) -> dict[UUID, int]:
    rows = await conn.fetch("SELECT request_id, count(*) AS n FROM respool.events GROUP BY 1")
    return {r["request_id"]: r["n"] for r in rows}


async def test_prune_removes_every_terminal_request_and_keeps_live_ones(
    conn: asyncpg.Connection, ids: dict[str, UUID]
) -> None:
    events_before = await _events(conn)
    usage_before = await conn.fetch("SELECT * FROM respool.pool_usage ORDER BY pool, key")
    queue_before = await conn.fetch("SELECT pool, request_id FROM respool.queue ORDER BY 1, 2")
    now = await conn.fetchval("SELECT now()")

    assert await db_ops.prune_requests(conn, now) == len(TERMINAL)

    assert await _remaining(conn, ids) == set(LIVE)
    events_after = await _events(conn)
    for name in TERMINAL:
        assert ids[name] not in events_after, name
    for name in LIVE:  # the history of live requests is untouched
        assert events_after[ids[name]] == events_before[ids[name]], name
    assert await conn.fetch("SELECT * FROM respool.pool_usage ORDER BY pool, key") == usage_before
    assert await conn.fetch("SELECT pool, request_id FROM respool.queue ORDER BY 1, 2") == (
        queue_before
    )
    assert await conn.fetch("SELECT * FROM respool.invariant_violations") == []
    assert await db_ops.prune_requests(conn, now) == 0


async def test_prune_respects_the_cutoff_and_the_limit(
    conn: asyncpg.Connection, ids: dict[str, UUID]
) -> None:
    # finished: b1 00:30, a1 02:00, c1 03:30 | r1 03:40, x1 04:05, k1 04:20, b2 05:00
    assert await db_ops.prune_requests(conn, at(D2, 3, 35), limit=2) == 2
    assert await _remaining(conn, ids) == set(LIVE) | {"c1", "r1", "x1", "k1", "b2"}
    assert await db_ops.prune_requests(conn, at(D2, 3, 35)) == 1
    assert await _remaining(conn, ids) == set(LIVE) | {"r1", "x1", "k1", "b2"}
    # the cutoff is strict: finished_at exactly at the cutoff stays
    assert await db_ops.prune_requests(conn, at(D2, 4, 5)) == 1  # r1
    assert "x1" in await _remaining(conn, ids)


async def test_prune_older_than_uses_the_database_clock(
    conn: asyncpg.Connection, ids: dict[str, UUID]
) -> None:
    assert await db_ops.prune_older_than(conn, 100 * 365 * 86400) == 0
    assert await db_ops.prune_older_than(conn, 3600) == len(TERMINAL)
    assert await _remaining(conn, ids) == set(LIVE)


async def test_prune_skips_rows_another_transaction_holds(
    db_url: str, conn: asyncpg.Connection, ids: dict[str, UUID]
) -> None:
    other = await connect(db_url, application_name=APP_CLI)
    try:
        async with other.transaction():
            await other.execute(
                "SELECT 1 FROM respool.requests WHERE id = $1 FOR UPDATE", ids["a1"]
            )
            now = await conn.fetchval("SELECT now()")
            pruned = await asyncio.wait_for(db_ops.prune_requests(conn, now), 10)
            assert pruned == len(TERMINAL) - 1
        assert await _remaining(conn, ids) == set(LIVE) | {"a1"}
        assert await db_ops.prune_requests(conn, now) == 1
    finally:
        await other.close()


async def test_prune_refuses_bad_arguments(conn: asyncpg.Connection) -> None:
    with pytest.raises(BadInput) as err:
        await db_ops.prune_requests(conn, at(D2, 0), limit=0)
    assert err.value.field == "limit"
    with pytest.raises(ValueError):
        await db_ops.prune_older_than(conn, -1)


async def test_prune_over_http_is_admin_only(
    db_url: str, conn: asyncpg.Connection, ids: dict[str, UUID]
) -> None:
    reader_token, _ = await tokens.create_token(conn, name="ops", role="reader")
    client_token, _ = await tokens.create_token(
        conn, name="ci", role="client", subject_patterns=["team-*"]
    )
    async with running_server(db_url, auth="on", admin_token="admin-secret") as srv:
        c = srv.client
        admin = {"Authorization": "Bearer admin-secret"}
        r = await c.post("/v1/retention/prune", json={"older_than": "7d"})
        assert r.status_code == 401
        for token in (reader_token, client_token):
            r = await c.post(
                "/v1/retention/prune",
                json={"older_than": "7d"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert r.status_code == 403
        r = await c.post("/v1/retention/prune", json={"older_than": "soon"}, headers=admin)
        assert r.status_code == 400 and r.json()["field"] == "older_than"
        r = await c.post("/v1/retention/prune", json={"older_than": "7d", "x": 1}, headers=admin)
        assert r.status_code == 400
        # the scenario ran in 2025: everything terminal is older than 7 days
        r = await c.post("/v1/retention/prune", json={"older_than": "7d"}, headers=admin)
        assert r.status_code == 200, r.text
        assert r.json()["pruned"] == len(TERMINAL)
        r = await c.post("/v1/retention/prune", json={"older_than": "0s"}, headers=admin)
        assert r.json()["pruned"] == 0  # live requests never go
