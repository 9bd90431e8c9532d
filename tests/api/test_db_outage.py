"""The API when its database is away: 503 with ``Retry-After``, never a 500 or a hang.

* every connection-level database error (refused, lost, shutting down, in recovery, backend
  terminated, too many clients, asyncpg's dead pooled connection) answers 503 + ``Retry-After``;
* acquiring a pool connection and running a statement are bounded (app/db/connect.py):
  a full pool or a statement stuck on a lock answers 503 instead of waiting forever;
* a pooled connection the server closed while idle is skipped: the statement, never sent,
  runs on another connection (``BoundedPool``).

tests/faults/ crashes PostgreSQL, kills backends and cuts the network for real; these are the
quick, deterministic versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asyncpg
import pytest

import app.db.connect as connect_module
from app.api.errors import RETRY_AFTER
from app.db import pools as db_pools
from app.db.connect import APP_API, APP_CLI, DeadConnectionError, connect, create_pool
from app.reconciler import Reconciler
from support.db import direct
from support.http import error, ok
from support.server import Server, list_pools_failing, running_server


def _outage_answer(response: Any) -> None:
    body = error(response, 503, None)
    assert body["detail"] == "database unavailable, retry later"
    assert response.headers["retry-after"] == str(RETRY_AFTER)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.CrashShutdownError("terminating connection because of crash of another server"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_database_errors_answer_503_with_retry_after(
    module_server: Server, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    _outage_answer(await list_pools_failing(module_server, monkeypatch, exc))


async def test_other_internal_errors_stay_500(
    module_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    exc = asyncpg.InternalClientError("unknown error in protocol implementation")
    r = await list_pools_failing(module_server, monkeypatch, exc)
    assert r.status_code == 500 and "retry-after" not in r.headers


async def test_a_full_pool_answers_503_after_the_queue_timeout(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A call waits in line for a busy pool's connection (docs/api.md, "Backpressure"), bounded.
    monkeypatch.setattr(connect_module, "QUEUE_TIMEOUT", 0.3)
    async with running_server(db_url, db_pool_size=1) as server:
        pool: asyncpg.Pool = server.app.state.db
        held = await pool.acquire(timeout=5)  # the pool's only connection
        try:
            start = time.monotonic()
            _outage_answer(await server.client.get("/v1/pools"))
            assert time.monotonic() - start < 5
        finally:
            await pool.release(held)
        ok(await server.client.get("/v1/pools"))


async def test_a_statement_stuck_on_a_lock_answers_503_and_changes_nothing(
    db_url: str, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connect_module, "COMMAND_TIMEOUT", 0.5)
    async with running_server(db_url) as server:
        c = server.client
        ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 2}}), 201)
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM respool.pools WHERE name = 'p' FOR UPDATE")
            start = time.monotonic()
            _outage_answer(await c.patch("/v1/pools/p", json={"capacity": {"gpu": 4}}))
            assert time.monotonic() - start < 5
        assert ok(await c.get("/v1/pools/p"))["capacity"] == {"gpu": 2}
        got = ok(await c.patch("/v1/pools/p", json={"capacity": {"gpu": 4}}))
        assert got["capacity"] == {"gpu": 4}


async def test_a_dead_pooled_connection_is_skipped(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first connection tried fails as asyncpg does after a FATAL that arrived while it was
    idle; the statement runs on another connection and the dead one is terminated."""
    pool = await create_pool(db_url, size=2, application_name=APP_API)
    try:
        broken = _dead_once("fetchval", monkeypatch)
        assert await pool.fetchval("SELECT 41 + 1") == 42
        assert broken and broken[0].is_closed()
        # Any other InternalClientError is not retried.
        monkeypatch.setattr(asyncpg.connection.Connection, "fetchval", _raise_other)
        with pytest.raises(asyncpg.InternalClientError):
            await pool.fetchval("SELECT 1")
    finally:
        await asyncio.wait_for(pool.close(), 10)


async def _raise_other(self: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
    raise asyncpg.InternalClientError("unknown error in protocol implementation")


def _dead_once(method: str, monkeypatch: pytest.MonkeyPatch) -> list[asyncpg.Connection]:
    """Make asyncpg's ``method`` fail once the way it does on a connection the server closed."""
    original = getattr(asyncpg.connection.Connection, method)
    broken: list[asyncpg.Connection] = []

    async def failing(self: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
        if not broken:
            broken.append(self)
            raise asyncpg.InternalClientError(
                "cannot switch to state 12; another operation (2) is in progress"
            )
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.connection.Connection, method, failing)
    return broken


async def test_a_dead_connection_is_a_lost_connection(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = await connect(db_url, application_name=APP_CLI)
    try:
        broken = _dead_once("fetchval", monkeypatch)
        with pytest.raises(DeadConnectionError) as err:
            await conn.fetchval("SELECT 1")
        assert isinstance(err.value, asyncpg.PostgresConnectionError)
        assert broken == [conn] and conn.is_closed()
    finally:
        conn.terminate()


async def test_the_reconciler_survives_a_dead_connection(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its backend terminated while it waited between passes: the reconciler reconnects and
    keeps running passes (it used to end on asyncpg's InternalClientError)."""
    async with direct(db_url) as conn:
        await db_pools.create_pool(conn, name="p", capacity={"gpu": 1})
    broken = _dead_once("fetch", monkeypatch)
    reconciler = Reconciler(db_url, interval=0.05)
    task = asyncio.create_task(reconciler.run())
    try:
        for _ in range(200):
            if broken and reconciler.passes >= 3:
                break
            await asyncio.sleep(0.02)
        assert broken and broken[0].is_closed()
        assert not task.done(), task
        assert reconciler.passes >= 3
    finally:
        reconciler.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
