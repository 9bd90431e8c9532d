"""Databases for tests: create/drop by name, connections with respool's codecs, fingerprints."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import pytest

from app.db import tokens
from app.db.connect import APP_CLI, connect
from app.db.dsn import with_database
from app.db.migrate import migrate

__all__ = [
    "ClockedConn",
    "Copies",
    "assert_refused",
    "assert_refused_read_write",
    "connections_by_app",
    "create_database",
    "database_fingerprint",
    "direct",
    "drop_database",
    "drop_database_later",
    "finish_drops",
    "issue_tokens",
    "migrated",
    "new_name",
    "run_sync",
]

T = TypeVar("T")


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run async setup work on a private loop in a worker thread.

    This keeps sync fixtures independent of pytest-asyncio's loops (``asyncio.run`` in the main
    thread would reset the current event loop).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


# One reconciler pass over the pool named $1 at the instant $2 (its JSON summary).
RECONCILE_POOL = "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = $1), $2)"


@contextlib.asynccontextmanager
async def direct(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own (respool codecs), closed on the way out."""
    conn = await connect(dsn, application_name=APP_CLI)
    try:
        yield conn
    finally:
        await conn.close()


async def connections_by_app(conn: asyncpg.Connection) -> Counter[str]:
    """Client connections to ``conn``'s database by application_name, ``conn`` itself excluded.

    Only client backends count: an autovacuum worker also shows the database's name (with an
    empty application_name) while it vacuums or analyzes a table there.
    """
    rows = await conn.fetch(
        "SELECT application_name, count(*) AS n FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'"
        " GROUP BY application_name"
    )
    return Counter({r["application_name"]: r["n"] for r in rows})


async def migrated(dsn: str) -> str:
    """Migrate the database at ``dsn`` with the installed SQL; returns ``dsn``."""
    async with direct(dsn) as conn:
        await migrate(conn)
    return dsn


async def _admin_exec(admin: str, statement: str) -> None:
    conn = await asyncpg.connect(admin, timeout=30)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def new_name(kind: str) -> str:
    """A fresh database name, ``respool_<kind>_<12 hex>``."""
    return f"respool_{kind}_{uuid.uuid4().hex[:12]}"


def create_database(admin: str, name: str, template: str | None = None) -> str:
    """CREATE DATABASE ``name`` (a copy of ``template``, else empty); returns its DSN."""
    tmpl = f'"{template}"' if template else "template0"
    run_sync(lambda: _admin_exec(admin, f'CREATE DATABASE "{name}" TEMPLATE {tmpl}'))
    return with_database(admin, name)


def drop_database(admin: str, name: str) -> None:
    run_sync(lambda: _admin_exec(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def issue_tokens(dsn: str) -> dict[str, str]:
    """One token of each kind, by kind: ``admin`` (ops), ``client`` (team-a-ci, ``team-a:*``),
    ``reader`` (dashboard) and ``revoked`` (old, an admin token revoked)."""
    async with direct(dsn) as conn:
        admin, _ = await tokens.create_token(conn, name="ops", role="admin")
        client, _ = await tokens.create_token(
            conn, name="team-a-ci", role="client", subject_patterns=["team-a:*"]
        )
        reader, _ = await tokens.create_token(conn, name="dashboard", role="reader")
        revoked, _ = await tokens.create_token(conn, name="old", role="admin")
        await tokens.revoke_token(conn, "old")
    return {"admin": admin, "client": client, "reader": reader, "revoked": revoked}


async def client_token(dsn: str, *patterns: str) -> str:
    """A new client token for subjects matching ``patterns``, made in the database as
    ``respool token create`` makes it; its text."""
    async with direct(dsn) as conn:
        text, _ = await tokens.create_token(
            conn, name=new_name("client"), role="client", subject_patterns=list(patterns)
        )
    return text


_dropper: concurrent.futures.ThreadPoolExecutor | None = None
_drops: list[concurrent.futures.Future[None]] = []


def drop_database_later(admin: str, name: str) -> None:
    """:func:`drop_database` on a background thread: the next test need not wait for it."""
    global _dropper
    if _dropper is None:
        _dropper = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="drop-db")
    _drops.append(_dropper.submit(drop_database, admin, name))


def finish_drops() -> None:
    """Wait for every :func:`drop_database_later` (raising the first failure)."""
    while _drops:
        _drops.pop(0).result()


class Copies:
    """Fresh copies of a template database, made ahead on background threads.

    :meth:`take` hands out a copy that is ready (or waits for it) while the next ``ahead`` are
    being made, so a test does not wait for its CREATE DATABASE: it ran while the test before
    it did. Every copy is a new database, used by one taker only. :meth:`close` drops the
    copies nobody took (in the background: :func:`finish_drops` waits for them).
    """

    def __init__(self, admin: str, template: str, *, ahead: int = 2) -> None:
        self.admin, self.template, self.ahead = admin, template, ahead
        self._makers = concurrent.futures.ThreadPoolExecutor(ahead, thread_name_prefix="copy-db")
        self._ready: deque[concurrent.futures.Future[str]] = deque()

    def _make(self) -> str:
        name = new_name("copy")
        create_database(self.admin, name, self.template)
        return name

    def take(self) -> str:
        """The name of a new copy of the template."""
        while len(self._ready) <= self.ahead:
            self._ready.append(self._makers.submit(self._make))
        return self._ready.popleft().result()

    def close(self) -> None:
        self._makers.shutdown(wait=True)
        while self._ready:
            future = self._ready.popleft()
            if future.exception() is None:
                drop_database_later(self.admin, future.result())


_TABLES = (
    "pools", "pool_resources", "policies", "policy_resources", "requests", "events", "tokens",
)  # fmt: skip


async def database_fingerprint(dsn: str) -> dict[str, str]:
    """An md5 of every row of each respool base table (order-independent): equal fingerprints
    before and after a call mean the call changed nothing."""
    async with direct(dsn) as conn:
        out: dict[str, str] = {}
        for table in _TABLES:
            digest = "coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')"
            sql = f"SELECT count(*) || ':' || {digest} FROM respool.{table} t"  # noqa: S608
            out[table] = await conn.fetchval(sql)
        return out


async def assert_refused(conn: asyncpg.Connection, sql: str) -> None:
    """``sql`` is refused for lack of privilege (SQLSTATE 42501)."""
    with pytest.raises(asyncpg.InsufficientPrivilegeError) as err:
        await conn.execute(sql)
    assert err.value.sqlstate == "42501"


async def assert_refused_read_write(conn: asyncpg.Connection, sql: str) -> None:
    """Even in an explicit read-write transaction, ``sql`` is refused for lack of privilege."""
    await conn.execute("BEGIN READ WRITE")
    await assert_refused(conn, sql)
    await conn.execute("ROLLBACK")


async def function_calls(conn: asyncpg.Connection, function: str) -> int:
    """Calls of ``function`` (a regprocedure) in the current transaction so far (needs
    ``SET track_functions = 'all'``)."""
    n = await conn.fetchval("SELECT pg_stat_get_xact_function_calls($1::regprocedure)", function)
    return int(n or 0)


async def reconcile(conn: asyncpg.Connection, pool: str, now: Any = None) -> Any:
    """One ``respool.reconcile_pool`` pass of the pool named ``pool`` (at ``now``, default the
    database's clock); its summary."""
    return await conn.fetchval(
        "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = $1),"
        " coalesce($2, now()))",
        pool,
        now,
    )


class ClockedConn:
    """One database connection and a clock (:meth:`now`) that moves one second per call from
    ``clock0``; ``tick`` is how far it has moved. Reads and releases a request by its document."""

    clock0 = datetime(2031, 3, 1, tzinfo=UTC)

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.tick = 0

    def now(self) -> datetime:
        self.tick += 1
        return self.clock0 + timedelta(seconds=self.tick)

    async def get(self, doc: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = await self.conn.fetchval("SELECT respool.get_request($1)", doc["id"])
        return got

    async def release(self, doc: dict[str, Any]) -> None:
        await self.conn.fetchval(
            "SELECT respool.release_request(p_id => $1, p_now => $2)", doc["id"], self.now()
        )
