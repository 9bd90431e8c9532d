"""asyncpg connections and pools with respool's codecs and application names."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar, cast

import asyncpg
import msgspec

from app.db.dsn import primary_only
from app.db.named import query

__all__ = [
    "ACQUIRE_TIMEOUT",
    "APP_API",
    "APP_CLI",
    "APP_LISTENER",
    "APP_RECONCILER",
    "COMMAND_TIMEOUT",
    "BoundedPool",
    "Connection",
    "DEFAULT_MAX_PENDING",
    "PoolSaturated",
    "QUEUE_TIMEOUT",
    "WaitLine",
    "DeadConnectionError",
    "NotPrimaryError",
    "ServerRole",
    "connect",
    "create_pool",
    "init_connection",
    "is_dead_connection",
    "probe",
    "own_backend_pids",
    "server_role",
]

# application_name values, visible in pg_stat_activity (docs/ops.md).
APP_API = "respool-api"
APP_LISTENER = "respool-listener"
APP_RECONCILER = "respool-reconciler"
APP_CLI = "respool-cli"

# Every service connection runs with JIT off: the engine's statements are short OLTP queries, and
# on tables without statistics (a fresh or small database, which autovacuum never analyzes) the
# planner's estimates cross jit_above_cost, so PostgreSQL spends 0.3-0.6 s compiling a query that
# runs in 0.3 ms (respool.pool_usage, and with it GET /metrics and GET /v1/pools).
SERVER_SETTINGS = {"jit": "off"}

# Decimals go out as JSON numbers, so a cpu_count of 8.05 reaches SQL exactly as written.
_encoder = msgspec.json.Encoder(decimal_format="number")


def _encode_json(value: Any) -> str:
    return _encoder.encode(value).decode()


def _decode_json(text: str | bytes) -> Any:
    return msgspec.json.decode(text)


# Server PIDs of this process's open connections: a notification sent by one of them was caused
# by this process (app.logs.StateChangeLog logs only those, so each change is logged once).
_own_pids: set[int] = set()


def own_backend_pids() -> frozenset[int]:
    """Backend PIDs of the connections this process has open (made by ``init_connection``)."""
    return frozenset(_own_pids)


class DeadConnectionError(asyncpg.ConnectionDoesNotExistError):
    """A statement on a connection the server had already closed: a FATAL such as
    ``pg_terminate_backend`` arrived while the connection sat idle, before the socket's end.

    asyncpg reports this as an ``InternalClientError`` ("cannot switch to state ...; another
    operation (2) is in progress"), which no caller treats as a lost connection; it is a
    ``ConnectionDoesNotExistError`` here. The statement was refused before anything was sent.
    """


def is_dead_connection(exc: BaseException) -> bool:
    """True for :class:`DeadConnectionError` and for asyncpg's own form of it."""
    if isinstance(exc, DeadConnectionError):
        return True
    return isinstance(exc, asyncpg.InternalClientError) and str(exc).startswith(
        "cannot switch to state"
    )


Method = TypeVar("Method", bound=Callable[..., Awaitable[Any]])


def _closed_by_server_around(method: Method) -> Method:
    """``method`` of asyncpg's connection (looked up when called, as ``super()`` does), run
    inside :meth:`Connection._closed_by_server`."""
    name = method.__name__

    @functools.wraps(method)
    async def call(self: Connection, *args: Any, **kwargs: Any) -> Any:
        with self._closed_by_server():
            return await getattr(super(Connection, self), name)(*args, **kwargs)

    return cast(Method, call)


class Connection(asyncpg.Connection):
    """asyncpg's connection, except that a statement on a connection the server already closed
    raises :class:`DeadConnectionError` and closes it (``connect`` and ``create_pool`` use it),
    so the reconciler, the listener and the API handle it as the lost connection it is."""

    __slots__ = ()

    @contextlib.contextmanager
    def _closed_by_server(self) -> Iterator[None]:
        try:
            yield
        except asyncpg.InternalClientError as exc:
            if not is_dead_connection(exc):
                raise
            self.terminate()
            raise DeadConnectionError(f"connection closed by the server: {exc}") from exc

    # asyncpg's own methods (their signatures, ``timeout`` included), each inside
    # _closed_by_server.
    execute = _closed_by_server_around(asyncpg.Connection.execute)
    fetch = _closed_by_server_around(asyncpg.Connection.fetch)
    fetchrow = _closed_by_server_around(asyncpg.Connection.fetchrow)
    fetchval = _closed_by_server_around(asyncpg.Connection.fetchval)


async def init_connection(conn: asyncpg.Connection) -> None:
    """Register json/jsonb codecs: Python values in, Python values out (via msgspec).

    Also records the connection's backend PID until it closes (:func:`own_backend_pids`).
    """
    pid = conn.get_server_pid()
    _own_pids.add(pid)
    conn.add_termination_listener(lambda _conn: _own_pids.discard(pid))
    for typename in ("jsonb", "json"):
        await conn.set_type_codec(
            typename,
            schema="pg_catalog",
            encoder=_encode_json,
            decoder=_decode_json,
            format="text",
        )


class NotPrimaryError(ConnectionError):
    """The server is a standby (``pg_is_in_recovery()``): reconnect until on the primary."""


class ServerRole(msgspec.Struct, frozen=True):
    """Which server a connection is on and whether it is the primary."""

    node: str  # host:port as the server sees it
    primary: bool


async def server_role(conn: asyncpg.Connection) -> ServerRole:
    """The server ``conn`` talks to: its address and whether it accepts writes."""
    row = await conn.fetchrow(query("server_role"))
    assert row is not None
    node = f"{row['addr']}:{row['port']}" if row["addr"] else "local socket"
    return ServerRole(node=node, primary=not row["standby"])


async def connect(
    dsn: str, *, application_name: str, connect_timeout: float = 10.0, primary: bool = False
) -> asyncpg.Connection:
    """Open one connection to ``dsn`` tagged with ``application_name``.

    ``primary``: check that the server is the primary (not in recovery) and raise
    :class:`NotPrimaryError` if not, so a long-lived connection (the listener, the reconciler)
    never settles on a standby after a failover. A multi-host DSN prefers the primary anyway
    (:func:`app.db.dsn.primary_only`).
    """
    try:
        conn: asyncpg.Connection = await asyncpg.connect(
            dsn,
            timeout=connect_timeout,
            server_settings={**SERVER_SETTINGS, "application_name": application_name},
            connection_class=Connection,
            **primary_only(dsn),
        )
    except asyncpg.exceptions.TargetServerAttributeNotMatched as exc:
        # Mid-failover no host accepts writes yet: a connection error like any other.
        raise NotPrimaryError(str(exc)) from exc
    try:
        await init_connection(conn)
        if primary:
            role = await server_role(conn)
            if not role.primary:
                raise NotPrimaryError(f"{role.node} is a standby (in recovery)")
    except BaseException:
        await conn.close()
        raise
    return conn


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool ``reset``: nothing more than what asyncpg always does on release (roll back an open
    transaction, drop listeners).

    asyncpg's default also sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``,
    one more round trip on every release, that is on every API query (measured: 0.5 ms instead
    of 0.2 ms for a pool ``SELECT 1``; a third of a long-poll's wake latency). Pool connections
    keep no session state: use ``SET LOCAL`` and ``pg_advisory_xact_lock``, never their
    session-level forms, and LISTEN only on a connection of its own.
    """


# Bounds of a pool call, so that a database that is down, unreachable or blackholed gives the API
# an error it answers with 503 (app.api.errors) instead of a request that hangs: waiting for a
# free connection (or connecting) when the caller names no bound of its own, and one statement on
# a connection.
ACQUIRE_TIMEOUT = 10.0
COMMAND_TIMEOUT = 30.0
# How long a call may wait in line for a busy pool's connection (docs/api.md, "Backpressure").
# A statement ends within COMMAND_TIMEOUT and a dead database fails fast (its connections are lost,
# a new one fails to connect within the connect timeout), so a line moves; this only bounds a
# database that serves so slowly that nothing moves for two minutes: then TimeoutError (503).
QUEUE_TIMEOUT = 120.0
# Calls that may wait in line for a connection (RESPOOL_MAX_PENDING): as many as the connections
# the server accepts (RESPOOL_MAX_CONNECTIONS), so a burst of every open connection's call queues.
DEFAULT_MAX_PENDING = 20_000


class PoolSaturated(asyncpg.InterfaceError):
    """The line of calls waiting for a database connection is full (``limit`` calls): refused at
    once, before anything was done (the API answers 429 with ``Retry-After``).

    An ``InterfaceError``, so background loops that retry a database that cannot serve them
    (app.liveness, app.notify) treat it as such."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"{limit} calls are already waiting for a database connection (RESPOOL_MAX_PENDING)"
        )
        self.limit = limit


class WaitLine:
    """Counts the calls waiting for a connection of one pool and refuses one past ``limit``.

    ``join`` / ``leave`` around the wait; the create coalescer (app.api.coalesce) counts its
    pending creates here too, so one bound covers both."""

    __slots__ = ("depth", "limit", "refused")

    def __init__(self, limit: int = DEFAULT_MAX_PENDING) -> None:
        self.limit = limit
        self.depth = 0
        self.refused = 0  # calls answered 429 so far (for logs and tests)

    def join(self) -> None:
        """One more call in line; :class:`PoolSaturated` if ``limit`` are already waiting."""
        if self.depth >= self.limit:
            self.refused += 1
            raise PoolSaturated(self.limit)
        self.depth += 1

    def leave(self, count: int = 1) -> None:
        self.depth -= count


class BoundedPool(asyncpg.Pool):
    """An asyncpg pool whose ``acquire`` waits in a bounded line, and whose one-statement calls
    (``execute``, ``fetch``, ``fetchrow``, ``fetchval``) skip connections the server closed while
    they were idle.

    ``acquire()`` without a ``timeout``: a free connection is taken at once (connecting a new one
    within ``ACQUIRE_TIMEOUT``); when every connection is busy the call joins the pool's
    :class:`WaitLine` (``line``; :class:`PoolSaturated` when it is full) and waits its turn, at
    most ``QUEUE_TIMEOUT`` seconds (``TimeoutError``). ``pool.fetch()`` and friends acquire that
    way. An explicit ``timeout`` waits that long whatever the line holds (the create coalescer's
    flushers, which hold creates already counted in the line, and health checks). The release
    waits at most ``ACQUIRE_TIMEOUT`` (a cancelled statement).
    A statement that fails with :class:`DeadConnectionError` was never sent, so it runs again on
    another connection (the dead one is already closed).
    """

    __slots__ = ("line",)
    line: WaitLine  # set by create_pool

    async def _acquire(self, timeout: float | None) -> Any:  # noqa: ASYNC109
        # asyncpg's own acquire (Pool._acquire, what PoolAcquireContext awaits) around a line.
        line: WaitLine = self.line
        free = not self._queue.empty()  # type: ignore[attr-defined]
        if timeout is not None or (free and line.depth == 0):  # (nobody in line to overtake)
            return await super()._acquire(  # type: ignore[misc]
                ACQUIRE_TIMEOUT if timeout is None else timeout
            )
        line.join()
        try:
            proxy = await super()._acquire(QUEUE_TIMEOUT)  # type: ignore[misc]
        finally:
            line.leave()
        # asyncpg bounds the release by the acquire's timeout: keep the usual bound for it.
        proxy._holder._timeout = ACQUIRE_TIMEOUT
        return proxy

    async def _on_live_connection(self, method: str, *args: Any, **kwargs: Any) -> Any:
        tries = self.get_max_size() + 1  # at worst, every pooled connection is dead
        for attempt in range(tries):
            async with self.acquire() as conn:
                try:
                    return await getattr(conn, method)(*args, **kwargs)
                except DeadConnectionError:
                    if attempt == tries - 1:
                        raise
        raise AssertionError("unreachable")

    # The overrides keep asyncpg's signatures (its ``timeout`` arguments included).
    async def execute(
        self,
        query: str,
        *args: object,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> str:
        result: str = await self._on_live_connection("execute", query, *args, timeout=timeout)
        return result

    async def fetch(  # type: ignore[override]
        self,
        query: str,
        *args: object,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await self._on_live_connection(
            "fetch", query, *args, timeout=timeout
        )
        return rows

    async def fetchrow(  # type: ignore[override]
        self,
        query: str,
        *args: object,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> asyncpg.Record | None:
        row: asyncpg.Record | None = await self._on_live_connection(
            "fetchrow", query, *args, timeout=timeout
        )
        return row

    async def fetchval(
        self,
        query: str,
        *args: object,
        column: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        return await self._on_live_connection(
            "fetchval", query, *args, column=column, timeout=timeout
        )


async def create_pool(
    dsn: str,
    *,
    size: int,
    application_name: str,
    connect_timeout: float = 10.0,
    max_pending: int = DEFAULT_MAX_PENDING,
) -> BoundedPool:
    """Create a pool of up to ``size`` connections tagged with ``application_name``.

    A call waits for a busy pool's connection in a line of at most ``max_pending`` calls
    (:class:`PoolSaturated` past it, a 429 in the API) and at most ``QUEUE_TIMEOUT`` seconds;
    connecting takes at most ``connect_timeout`` and a statement at most ``COMMAND_TIMEOUT``
    seconds (``TimeoutError``, a 503 in the API).
    """
    pool = BoundedPool(
        dsn,
        min_size=min(size, 2),
        max_size=size,
        max_queries=50000,
        max_inactive_connection_lifetime=300.0,
        timeout=connect_timeout,
        command_timeout=COMMAND_TIMEOUT,
        init=init_connection,
        reset=_keep_session,
        loop=None,
        connection_class=Connection,
        record_class=asyncpg.Record,
        server_settings={**SERVER_SETTINGS, "application_name": application_name},
        **primary_only(dsn),
    )
    pool.line = WaitLine(max_pending)
    await pool  # opens the first connections
    return pool


async def probe(conn: asyncpg.Connection, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
    """One round trip (``sql/queries/connect.sql``); raises when the connection is dead."""
    await conn.execute(query("connection_probe"), timeout=timeout)
