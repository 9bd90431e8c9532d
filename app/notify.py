"""Wake long-poll waiters from PostgreSQL notifications (one LISTEN connection per process).

The engine calls ``pg_notify('respool_request', '{"id", "status", "version", "pool"}')`` in the
transaction of every status change (but not for the changes a create makes to the request it is
creating: nobody can wait for it yet), so a notification arrives only after the change committed.
The payload is a hint: a woken waiter gets its version and status (``Waiter.hint``) and still
reads the request before it answers.

Usage, without lost wake-ups::

    with notifier.waiter(request_id) as w:   # 1. register
        doc = await read()                   # 2. check the database
        if not done(doc):
            await w.wait(timeout)            # 3. wait (holds no database connection)

A notification that arrives between 1 and 3 wakes the waiter, so 3 returns at once.

When the LISTEN connection drops, the notifier reconnects with exponential backoff and jitter,
and then wakes every waiter so each re-reads its request (notifications sent while it was down
are lost). For anything else that slips through, :meth:`Notifier.use_backstop` reads the version
of every waited request every few seconds and wakes the waiters whose request changed.
``wake_all()`` on shutdown answers every open wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any
from uuid import UUID

import asyncpg
import msgspec

from app.db.connect import APP_LISTENER, connect, probe
from app.db.requests import Seen

__all__ = ["CHANNEL", "Notifier", "RateLimitedWarning", "Waiter"]

CHANNEL = "respool_request"

log = logging.getLogger("respool.notify")


class _Payload(msgspec.Struct):
    id: UUID
    status: str | None = None
    version: int | None = None
    pool: str | None = None


_decode_payload = msgspec.json.Decoder(_Payload).decode


class RateLimitedWarning:
    """A warning logged at most once per ``every`` seconds; the next one says how many were
    held back. Anyone who can connect can NOTIFY on respool's channels (PostgreSQL has no
    privilege for it), so a flood of foreign payloads must not become a flood of log lines."""

    def __init__(self, logger: logging.Logger, every: float = 60.0) -> None:
        self._log = logger
        self._every = every
        self._next = 0.0
        self.suppressed = 0  # held back since the last line

    def __call__(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self.suppressed += 1
            return
        self._next = now + self._every
        if self.suppressed:
            msg += " (and %d more like it in the last %.0fs)"
            args = (*args, self.suppressed, self._every)
            self.suppressed = 0
        self._log.warning(msg, *args)


class Waiter:
    """One registered wait for one request; ``wait()`` returns True when woken.

    A flag and, while waiting, one future and one timer: no task per wait, and nothing to cancel
    when the time runs out."""

    __slots__ = ("_future", "_woken", "hint", "request_id", "seen")

    def __init__(self, request_id: UUID) -> None:
        self.request_id = request_id
        self._woken = False
        self._future: asyncio.Future[None] | None = None
        self.hint: Seen | None = None  # what the waking notification (or backstop) said
        self.seen: Seen | None = None  # what the waiter last read: the backstop compares

    def wake(self, hint: Seen | None = None) -> None:
        self._woken = True
        self.hint = hint
        _resolve(self._future)

    @property
    def woken(self) -> bool:
        return self._woken

    async def wait(self, seconds: float) -> bool:
        """Wait until woken or for ``seconds``; clears the wake flag for the next round."""
        if seconds > 0 and not self._woken:
            loop = asyncio.get_running_loop()
            future = self._future = loop.create_future()
            timer = loop.call_later(seconds, _resolve, future)
            try:
                await future
            finally:
                timer.cancel()
                self._future = None
        woken, self._woken = self._woken, False
        return woken


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


Connector = Callable[[], Awaitable[asyncpg.Connection]]
# A batch of request ids -> the version and status of those that exist.
VersionReader = Callable[[list[UUID]], Awaitable[Mapping[UUID, Seen]]]
BACKSTOP_BATCH = 500  # ids per backstop read


class Notifier:
    """The process's LISTEN connection and the waiters it wakes, keyed by request id."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        connector: Connector | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        check_interval: float = 5.0,
    ) -> None:
        self._connector: Connector | None = connector
        if connector is None and dsn is not None:
            self.use_dsn(dsn)
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._check_interval = check_interval
        self._waiters: dict[UUID, set[Waiter]] = {}
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._lost: asyncio.Event | None = None
        self._connected: asyncio.Event | None = None
        self._closing = False
        self.reconnects = 0  # successful connections after the first one
        self._observers: list[Callable[[int, str], None]] = []
        self._malformed = RateLimitedWarning(log)
        self._backstop: VersionReader | None = None
        self._backstop_every = 2.0
        self._sweeper: asyncio.Task[None] | None = None
        self._backstop_failed = RateLimitedWarning(log)

    # --- state ----------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """True while the LISTEN connection is up."""
        conn = self._conn
        return conn is not None and not conn.is_closed() and not self._closing

    @property
    def closing(self) -> bool:
        """True once shutdown began: waiters should answer with the current state."""
        return self._closing

    @property
    def waiting(self) -> int:
        return sum(len(s) for s in self._waiters.values())

    # --- lifecycle ------------------------------------------------------------------------

    def use_dsn(self, dsn: str) -> None:
        """Listen on ``dsn`` (a dedicated connection, never one from the API's pool)."""

        async def connector() -> asyncpg.Connection:
            # The primary only: notifications are sent where the writes happen.
            return await connect(dsn, application_name=APP_LISTENER, primary=True)

        self._connector = connector

    async def start(self, *, ready_timeout: float = 10.0) -> None:
        """Start listening in the background; waits up to ``ready_timeout`` for the first
        connection (a database that is down is not fatal: the loop keeps retrying)."""
        if self._task is not None:
            return
        if self._connector is None:
            raise RuntimeError("Notifier.start() needs a dsn (use_dsn) or a connector")
        self._closing = False
        self._lost = asyncio.Event()
        self._connected = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="respool-listener")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), ready_timeout)

    def begin_shutdown(self) -> None:
        """Answer every open wait now, and every later one at once (call from the loop)."""
        self._closing = True
        self.wake_all()

    async def close(self) -> None:
        self.begin_shutdown()
        for task in (self._task, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._sweeper = None
        await self._drop_connection()

    def use_backstop(self, read: VersionReader, every: float) -> None:
        """Every ``every`` seconds, read the version and status of every waited request in
        batches (``read``) and wake, with what was read as the hint, each waiter whose ``seen``
        differs: a polling backstop for anything the notifications miss, a few queries per
        period for all waiters instead of a read by each."""
        self._backstop, self._backstop_every = read, every
        if self._sweeper is None and not self._closing:
            self._sweeper = asyncio.create_task(
                self._sweep(), name="respool-backstop", context=contextvars.Context()
            )  # not the context of the request that happened to start it

    async def _sweep(self) -> None:
        while not self._closing:
            await asyncio.sleep(self._backstop_every)
            ids, read = list(self._waiters), self._backstop
            assert read is not None  # set before the sweeper starts
            for i in range(0, len(ids), BACKSTOP_BATCH):
                chunk = ids[i : i + BACKSTOP_BATCH]
                try:
                    found = await read(chunk)
                except Exception as exc:  # the database is away: the next period retries
                    self._backstop_failed("backstop: cannot read waited requests (%s)", exc)
                    break
                for rid in chunk:
                    now = found.get(rid)
                    for w in self._waiters.get(rid, ()):
                        if w.seen != now:
                            w.wake(now)

    def observe(self, observer: Callable[[int, str], None]) -> None:
        """Also call ``observer(sender_pid, payload)`` for every notification (app.logs)."""
        self._observers.append(observer)

    # --- waiters --------------------------------------------------------------------------

    @contextlib.contextmanager
    def waiter(self, request_id: UUID) -> Iterator[Waiter]:
        w = Waiter(request_id)
        if self._closing:
            w.wake()
        self._waiters.setdefault(request_id, set()).add(w)
        try:
            yield w
        finally:
            group = self._waiters.get(request_id)
            if group is not None:
                group.discard(w)
                if not group:
                    del self._waiters[request_id]

    def wake(self, request_id: UUID, hint: Seen | None = None) -> None:
        for w in self._waiters.get(request_id, ()):
            w.wake(hint)

    def wake_all(self) -> None:
        for group in self._waiters.values():
            for w in group:
                w.wake()

    # --- the LISTEN loop ------------------------------------------------------------------

    def _on_notify(self, _conn: Any, pid: int, _channel: str, payload: object) -> None:
        for observer in self._observers:
            try:
                observer(pid, str(payload))
            except Exception:  # an observer never stops the wake-ups
                log.exception("notification observer failed")
        try:
            p = _decode_payload(str(payload))
        except (msgspec.DecodeError, msgspec.ValidationError):
            self._malformed("ignoring malformed %s payload: %.200r", CHANNEL, payload)
            return
        hint = None if p.version is None or p.status is None else Seen(p.version, p.status)
        self.wake(p.id, hint)

    def _on_terminate(self, _conn: Any) -> None:
        if self._lost is not None:
            self._lost.set()

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2.0)
            if not conn.is_closed():
                conn.terminate()

    async def _run(self) -> None:
        assert self._lost is not None and self._connected is not None
        delay = self._backoff_initial
        first = True
        assert self._connector is not None
        while not self._closing:
            try:
                conn = await self._connector()
                self._lost.clear()
                conn.add_termination_listener(self._on_terminate)
                await conn.add_listener(CHANNEL, self._on_notify)
                self._conn = conn
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._drop_connection()
                pause = delay * (0.5 + random.random())  # noqa: S311 - jitter, not crypto
                log.warning("listener: cannot connect (%s); retrying in %.2fs", exc, pause)
                await asyncio.sleep(pause)
                delay = min(delay * 2, self._backoff_max)
                continue

            delay = self._backoff_initial
            if first:
                first = False
            else:
                self.reconnects += 1
                log.info("listener: reconnected; waking %d waiters to re-read", self.waiting)
            # Notifications may have been missed while down (or before the first LISTEN):
            # every waiter re-reads its request.
            self.wake_all()
            self._connected.set()
            await self._watch(conn)
            await self._drop_connection()
            if not self._closing:
                log.warning("listener: connection lost; reconnecting")

    async def _watch(self, conn: asyncpg.Connection) -> None:
        """Return when the connection is lost (termination callback or a failed check)."""
        assert self._lost is not None
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), self._check_interval)
            if self._lost.is_set() or conn.is_closed():
                return
            try:
                await probe(conn, timeout=self._check_interval)
            except asyncio.CancelledError:
                raise
            except Exception:
                return
