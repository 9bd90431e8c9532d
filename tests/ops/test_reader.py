"""respool_reader (docs/ops.md): SELECT on the views only, nothing else (42501), and
``respool db grant-reader ROLE`` for login roles. tests/engine/test_reader_role.py covers the five
ops views and the engine functions; this covers the reporting views, every base table, writes
through the views, and a real login role made by the CLI."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest
from typer.testing import CliRunner

from app.db.connect import APP_CLI, connect
from cli.db import app as db_cli
from support import scenario
from support.db import assert_refused, assert_refused_read_write, direct

BASE_TABLES = [
    "pools", "pool_resources", "policies", "policy_resources", "requests", "queue_entries",
    "events", "tokens", "schema_migrations", "schema_repeatables",
]  # fmt: skip
REPORTING_VIEWS = [
    "holdings", "allocation_intervals", "usage_by_subject_day", "request_waits", "preemptions",
]  # fmt: skip
WRITES = [
    "INSERT INTO respool.request_events (request_id, at, to_status, attempt)"
    " VALUES (gen_random_uuid(), now(), 'queued', 1)",
    "DELETE FROM respool.request_events",
    "UPDATE respool.holdings SET status = 'released'",
    "DELETE FROM respool.events",
    "UPDATE respool.requests SET status = 'released'",
    "CREATE TABLE respool.mine (x int)",
    "SELECT respool.prune_requests(p_before => now())",
    "SELECT respool.release_request(p_id => (SELECT request_id FROM respool.holdings LIMIT 1))",
    "SELECT respool.reconcile_pool((SELECT gen_random_uuid()))",
    "SELECT respool.grant_reader(p_role => 'reader_test_x', p_create => true)",
    "TRUNCATE respool.events",
]


@pytest.fixture(scope="module")
async def reader(module_db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the reader role to a database with history and live requests, shared by
    the module's tests: each only reads, or tries a write that must be refused."""
    async with direct(module_db_url) as conn:
        await scenario.history(conn)
        await scenario.live(conn)
        role = await conn.fetchval("SELECT respool.ensure_reader_role()")
        await conn.execute(f'SET ROLE "{role}"')
        yield conn


async def test_reader_reads_the_reporting_views(reader: asyncpg.Connection) -> None:
    for view in REPORTING_VIEWS:
        assert await reader.fetchval(f"SELECT count(*) FROM respool.{view}") > 0, view  # noqa: S608


@pytest.mark.parametrize("table", BASE_TABLES)
async def test_reader_cannot_read_base_tables(reader: asyncpg.Connection, table: str) -> None:
    await assert_refused(reader, f"SELECT * FROM respool.{table} LIMIT 1")  # noqa: S608


@pytest.mark.parametrize("sql", WRITES)
async def test_reader_cannot_write(reader: asyncpg.Connection, sql: str) -> None:
    await assert_refused(reader, sql)


async def test_reader_sees_only_views_in_the_catalog(reader: asyncpg.Connection) -> None:
    grants = await reader.fetch(
        "SELECT c.relname, c.relkind::text AS relkind"
        "  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'respool' AND c.relkind IN ('r', 'v', 'm', 'p')"
        "   AND has_table_privilege(current_user, c.oid, 'SELECT')"
    )
    assert {g["relkind"] for g in grants} == {"v"}
    assert {g["relname"] for g in grants} >= set(REPORTING_VIEWS) | {"pool_usage", "queue"}


def _invoke(db_url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(db_cli, list(args), env={"RESPOOL_DATABASE_URL": db_url})
    return result.exit_code, result.output


async def test_grant_reader_makes_a_login_role_that_only_reads(db_url: str) -> None:
    role = f"ops_reader_{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(12)
    admin = await connect(db_url, application_name=APP_CLI)
    try:
        await scenario.history(admin)
        code, out = await asyncio.to_thread(_invoke, db_url, "grant-reader", role)
        assert code == 1 and f"role {role} does not exist" in out

        code, out = await asyncio.to_thread(
            _invoke, db_url, "grant-reader", role, "--create", "--statement-timeout", "1s"
        )
        assert code == 0, out
        assert f"created role {role}" in out and "statement_timeout 1000ms" in out
        await admin.execute(f"ALTER ROLE {role} PASSWORD '{password}'")

        ro = await asyncpg.connect(db_url, user=role, password=password)
        try:
            assert await ro.fetchval("SHOW statement_timeout") == "1s"
            assert await ro.fetchval("SHOW default_transaction_read_only") == "on"
            assert await ro.fetchval("SELECT count(*) FROM respool.pool_usage") > 0
            assert await ro.fetchval("SELECT count(*) FROM respool.usage_by_subject_day") > 0
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await ro.fetch("SELECT * FROM respool.requests")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await ro.execute(WRITES[0])
            # Two locks: transactions are read-only by default (25006) ...
            with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
                await ro.execute("SELECT respool.prune_requests(p_before => now())")
            # ... and in an explicit read-write transaction, privileges refuse it (42501).
            await assert_refused_read_write(ro, "SELECT respool.prune_requests(p_before => now())")
            # The statement timeout applies to this role.
            with pytest.raises(asyncpg.QueryCanceledError):
                await ro.execute("SELECT pg_sleep(3)")
        finally:
            await ro.close()

        code, out = await asyncio.to_thread(_invoke, db_url, "grant-reader", role, "--revoke")
        assert code == 0 and "no longer a member" in out, out
        ro = await asyncpg.connect(db_url, user=role, password=password)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await ro.fetch("SELECT * FROM respool.pool_usage")
            assert await ro.fetchval("SHOW default_transaction_read_only") == "off"
        finally:
            await ro.close()
    finally:
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_grant_reader_refuses_the_service_role(db_url: str) -> None:
    admin = await connect(db_url, application_name=APP_CLI)
    try:
        me = await admin.fetchval("SELECT current_user")
    finally:
        await admin.close()
    code, out = await asyncio.to_thread(_invoke, db_url, "grant-reader", me)
    assert code == 1
    assert "can already use respool's tables" in out
    code, out = await asyncio.to_thread(
        _invoke, db_url, "grant-reader", "x", "--statement-timeout", "soon"
    )
    assert code == 1 and "--statement-timeout" in out


# --- the reader is scoped to one database, with limits it cannot lift ------------------------


async def test_a_reader_of_one_database_cannot_read_another(
    db_url: str, module_db_url: str
) -> None:
    """respool_reader was cluster-wide: a reader of database A read database B's views."""
    role = f"ops_reader_{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(12)
    admin = await connect(db_url, application_name=APP_CLI)
    other = await connect(module_db_url, application_name=APP_CLI)
    try:
        code, out = await asyncio.to_thread(_invoke, db_url, "grant-reader", role, "--create")
        assert code == 0, out
        await admin.execute(f"ALTER ROLE {role} PASSWORD '{password}'")
        # Another respool database on the same server, its reader role set up too.
        assert await other.fetchval("SELECT respool.ensure_reader_role()") != (
            await admin.fetchval("SELECT respool.reader_role()")
        )
        ro = await asyncpg.connect(db_url, user=role, password=password)
        try:
            assert await ro.fetchval("SELECT count(*) FROM respool.pool_usage") >= 0
        finally:
            await ro.close()
        ro = await asyncpg.connect(module_db_url, user=role, password=password)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await ro.fetch("SELECT * FROM respool.pool_usage")
        finally:
            await ro.close()
        # The cluster-wide role keeps no privilege on either database's views.
        for conn in (admin, other):
            assert not await conn.fetchval(
                "SELECT has_table_privilege('respool_reader', 'respool.pool_usage', 'SELECT')"
                "    OR has_schema_privilege('respool_reader', 'respool', 'USAGE')"
            )
    finally:
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()
        await other.close()


async def test_a_reader_cannot_lift_its_limits(db_url: str) -> None:
    """No TEMP, a temp_file_limit it cannot SET, and a connection limit."""
    role = f"ops_reader_{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(12)
    admin = await connect(db_url, application_name=APP_CLI)
    ros: list[asyncpg.Connection] = []
    try:
        code, out = await asyncio.to_thread(_invoke, db_url, "grant-reader", role, "--create")
        assert code == 0 and "no TEMP" in out and "3 connections" in out, out
        await admin.execute(f"ALTER ROLE {role} PASSWORD '{password}'")
        for _ in range(3):
            ros.append(await asyncpg.connect(db_url, user=role, password=password))
        ro = ros[0]
        assert await ro.fetchval("SHOW temp_file_limit") == "100MB"
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await ro.execute("SET temp_file_limit = -1")
        await assert_refused_read_write(ro, "CREATE TEMP TABLE hog (x int)")
        with pytest.raises(asyncpg.TooManyConnectionsError):
            ros.append(await asyncpg.connect(db_url, user=role, password=password))
    finally:
        for ro in ros:
            await ro.close()
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()
