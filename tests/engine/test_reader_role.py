"""respool_reader may SELECT the five ops views and nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from engine_support import mk_policy, mk_pool, mk_req

from support.db import assert_refused

VIEWS = ["pool_usage", "policy_usage", "queue", "request_events", "invariant_violations"]


@pytest.fixture
async def reader(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    """`conn` with some data in every view, then SET ROLE to this database's reader role."""
    await mk_pool(conn, "p", {"gpu": 1})
    await mk_policy(conn, "S", "p", reserved={"gpu": 1})
    await mk_req(conn, "S", "p", resources={"gpu": 1})
    await mk_req(conn, "S", "p", resources={"gpu": 1})  # queued
    role = await conn.fetchval("SELECT respool.ensure_reader_role()")
    await conn.execute(f'SET ROLE "{role}"')
    try:
        yield conn
    finally:
        await conn.execute("RESET ROLE")


@pytest.mark.parametrize(
    ("view", "rows"),
    [
        ("pool_usage", 2),
        ("policy_usage", 2),
        ("queue", 1),
        ("request_events", 3),
        ("invariant_violations", 0),
    ],
)
async def test_reader_sees_the_views(reader: asyncpg.Connection, view: str, rows: int) -> None:
    assert await reader.fetchval("SELECT current_user = respool.reader_role()")
    # view names come from the fixed list above
    assert await reader.fetchval(f"SELECT count(*) FROM respool.{view}") == rows  # noqa: S608


@pytest.mark.parametrize(
    "table",
    [
        "requests",
        "pools",
        "policies",
        "pool_resources",
        "policy_resources",
        "queue_entries",
        "events",
    ],
)
async def test_reader_cannot_read_base_tables(reader: asyncpg.Connection, table: str) -> None:
    await assert_refused(reader, f"SELECT * FROM respool.{table}")  # noqa: S608


@pytest.mark.parametrize(
    "call",
    [
        "SELECT respool.create_pool(p_name => 'x', p_capacity => '{\"gpu\": 1}')",
        "SELECT respool.update_pool(p_ref => 'p', p_capacity => '{\"gpu\": 2}')",
        'SELECT respool.create_request(\'{"subject": "S", "pool": "p"}\')',
        "SELECT respool.delete_pool(p_ref => 'p', p_force => true)",
        "SELECT respool.allocate_pool((SELECT '00000000-0000-0000-0000-000000000000'::uuid))",
        "SELECT respool.list_pools()",
    ],
)
async def test_reader_cannot_call_functions_that_touch_tables(
    reader: asyncpg.Connection, call: str
) -> None:
    await assert_refused(reader, call)


async def test_reader_role_settings(conn: asyncpg.Connection) -> None:
    role = await conn.fetchrow(
        "SELECT rolconfig, rolcanlogin FROM pg_roles WHERE rolname = 'respool_reader'"
    )
    assert any(c.startswith("statement_timeout=") for c in role["rolconfig"])
    assert not role["rolcanlogin"]
