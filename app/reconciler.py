"""The reconciler loop (docs/preemption.md). Python only schedules: each pass over one pool is
one call of ``respool.reconcile_pool`` in its own transaction, and every decision is made in SQL.

A pass over every pool runs each ``interval`` seconds (the polling backstop), and a pass over one
pool runs at once when a ``respool_pool`` notification says that pool changed (a new queued
request, a capacity or policy change). A policy's window boundary (docs/preemption.md, "Time
windows") wakes it too: after each pass it reads when the next one is due and runs a full pass
then, if that is before the next interval. So does a rate key's refill (docs/rates.md): after
each pass it reads, per pool whose queue waits for a rate key's units, when enough charges will
have left their window, and passes that pool then. Several reconcilers may run against one
database: a pool locked by another one is skipped (``FOR NO KEY UPDATE SKIP LOCKED``) and
retried shortly after.
The reconciler holds one connection (``application_name = respool-reconciler``) for both LISTEN
and its passes; when it drops, it reconnects with backoff and jitter and starts with a full pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import msgspec

from app.db import ops as db_ops
from app.db import reconcile as db_reconcile
from app.db.connect import APP_RECONCILER, connect
from app.logs import StateChangeLog
from app.notify import CHANNEL, RateLimitedWarning

__all__ = ["POOL_CHANNEL", "PoolPass", "Reconciler", "reconcile_once"]

POOL_CHANNEL = "respool_pool"
RETRY_LOCKED = 0.05  # seconds before a pool that another transaction held is tried again
# seconds past a window boundary before the full pass that applies it: the pass's clock (its
# transaction's start) must have reached the boundary
BOUNDARY_MARGIN = 0.01
PRUNE_EVERY = 60.0  # seconds between retention prunes
ANALYZE_EVERY = 1.0  # seconds between looks for tables grown past their statistics
ANALYZE_RETRY = 60.0  # seconds before the next look after one failed
# Pool ids one burst of notifications may queue for single-pool passes. Anyone who can connect
# can NOTIFY respool_pool (PostgreSQL cannot revoke it); past this many, the ids are dropped and
# the next pass is a full one, whose cost is bounded by the number of pools that exist.
MAX_NOTIFIED_POOLS = 1000

log = logging.getLogger("respool.reconciler")


class PoolPass(msgspec.Struct, frozen=True):
    """What one pass did in one pool."""

    pool: str
    expired: int = 0
    grace_ended: int = 0
    preempted: int = 0
    allocated: int = 0
    rejected: int = 0

    def acted(self) -> bool:
        """Whether the pass changed anything."""
        return any((self.expired, self.grace_ended, self.preempted, self.allocated, self.rejected))


async def reconcile_pools(
    conn: asyncpg.Connection,
    pool_ids: list[UUID],
    on_error: Callable[[UUID, asyncpg.PostgresError], None] | None = None,
) -> tuple[list[PoolPass], list[UUID]]:
    """One pass over each pool (a transaction each); returns the passes and the pools skipped
    because another transaction held them. With ``on_error``, a pass that fails (its
    transaction rolled back) is reported and the other pools still run; without, it raises."""
    passes: list[PoolPass] = []
    skipped: list[UUID] = []
    for pool_id in pool_ids:
        try:
            doc = await db_reconcile.reconcile_pool(conn, pool_id)
        except asyncpg.PostgresError as exc:
            if on_error is None or conn.is_closed():
                raise
            on_error(pool_id, exc)  # tried again at the next full pass
            continue
        if doc is None:
            if await db_reconcile.pool_exists(conn, pool_id):
                skipped.append(pool_id)
            continue
        passes.append(msgspec.convert(doc, PoolPass))
    return passes, skipped


async def reconcile_once(conn: asyncpg.Connection, *, patience: float = 5.0) -> list[PoolPass]:
    """One pass over every pool; a pool held by another transaction is retried for up to
    ``patience`` seconds (``respool reconcile --once``)."""
    passes, pending = await reconcile_pools(conn, await db_reconcile.pool_ids(conn))
    deadline = time.monotonic() + patience
    while pending and time.monotonic() < deadline:
        await asyncio.sleep(RETRY_LOCKED)
        more, pending = await reconcile_pools(conn, pending)
        passes.extend(more)
    return sorted(passes, key=lambda p: p.pool)


Connector = Callable[[], Awaitable[asyncpg.Connection]]


class Reconciler:
    """The loop: full passes every ``interval`` seconds, single-pool passes when notified."""

    def __init__(
        self,
        dsn: str,
        *,
        interval: float = 1.0,
        retention: float | None = None,
        backoff_max: float = 5.0,
        connector: Connector | None = None,
        log_changes: bool = False,
    ) -> None:
        """``log_changes``: log the state changes this reconciler makes (a standalone
        ``respool reconcile``; inside ``serve`` the API's listener logs them)."""
        # The primary only (a standby after a failover is refused: NotPrimaryError, reconnect).
        self._connector = connector or (
            lambda: connect(dsn, application_name=APP_RECONCILER, primary=True)
        )
        self.interval = interval
        self.retention = retention
        self._backoff_max = backoff_max
        self._dirty: set[UUID] = set()
        self._overflow = False  # more notified ids than MAX_NOTIFIED_POOLS: do a full pass
        self._known: set[UUID] = set()  # pool ids seen by the last full pass
        self._refills: dict[UUID, float] = {}  # pool id -> when (monotonic) its rate units are back
        self._foreign = RateLimitedWarning(log)
        self._wake = asyncio.Event()
        self._stopping = False
        self._last_prune = 0.0
        self._last_analyze = 0.0
        self.analyzed: list[str] = []  # tables analyzed because they grew, oldest first
        self._state_log = StateChangeLog() if log_changes else None
        self.passes = 0  # pool passes that ran (for tests and metrics)
        self.sweeps = 0  # full passes over every pool that ran
        self.failures: list[str] = []  # passes that raised (rolled back), newest last

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def _on_notify(self, _conn: Any, pid: int, _channel: str, payload: object) -> None:
        try:
            pool_id = UUID(str(payload))
        except ValueError:
            self._foreign(
                "ignoring malformed %s payload from pid %s: %.200r", POOL_CHANNEL, pid, payload
            )
            return
        if len(self._dirty) >= MAX_NOTIFIED_POOLS and pool_id not in self._dirty:
            if not self._overflow:
                self._foreign(
                    "more than %d pools notified at once on %s; doing a full pass instead",
                    MAX_NOTIFIED_POOLS,
                    POOL_CHANNEL,
                )
            self._overflow = True
        else:
            self._dirty.add(pool_id)
        self._wake.set()

    async def _existing(self, conn: asyncpg.Connection, pool_ids: list[UUID]) -> list[UUID]:
        """``pool_ids`` minus ids of pools that do not exist: one query for the ids the last full
        pass did not see (a new pool, or a foreign notification), none for the rest."""
        unknown = [p for p in pool_ids if p not in self._known]
        if not unknown:
            return pool_ids
        found = await db_reconcile.existing_pool_ids(conn, unknown)
        self._known |= found
        return [p for p in pool_ids if p in self._known]

    def _on_state_change(self, _conn: Any, pid: int, _channel: str, payload: object) -> None:
        if self._state_log is not None:
            self._state_log(pid, str(payload))

    async def run(self) -> None:
        """Run until :meth:`stop`; errors are logged and retried after a reconnect, never fatal."""
        delay = 0.1
        while not self._stopping:
            conn: asyncpg.Connection | None = None
            try:
                conn = await self._connector()
                await conn.add_listener(POOL_CHANNEL, self._on_notify)
                if self._state_log is not None:
                    await conn.add_listener(CHANNEL, self._on_state_change)
                delay = 0.1
                await self._serve(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the loop die: log, reconnect, start over
                pause = delay * (0.5 + random.random())  # noqa: S311 - jitter, not crypto
                if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError | OSError):
                    log.warning("reconciler: %s; reconnecting in %.2fs", exc, pause)
                else:
                    self.failures = [*self.failures[-99:], f"loop: {type(exc).__name__}: {exc}"]
                    log.exception("reconciler: unexpected error; reconnecting in %.2fs", pause)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
                delay = min(delay * 2, self._backoff_max)
            finally:
                if conn is not None and not conn.is_closed():
                    conn.terminate()

    async def _serve(self, conn: asyncpg.Connection) -> None:
        next_full = 0.0  # a full pass first: notifications may have been missed while away
        retry: list[UUID] = []
        while not self._stopping:
            now = time.monotonic()
            if now >= next_full or self._overflow:
                self._dirty.clear()
                self._overflow = False
                targets = await db_reconcile.pool_ids(conn)
                self._known = set(targets)
                next_full = now + self.interval
                self.sweeps += 1
            else:
                due = {p for p, at in self._refills.items() if at <= now}
                targets = sorted(self._dirty | set(retry) | due)
                self._dirty.clear()
                targets = await self._existing(conn, targets)
            self._wake.clear()
            passes, retry = await reconcile_pools(conn, targets, self._failed)
            self.passes += len(passes)
            for p in passes:
                if p.acted():
                    log.info("reconcile %s: %s", p.pool, msgspec.json.encode(p).decode())
            await self._maybe_prune(conn)
            await self._maybe_analyze(conn)
            boundary = await self._next_boundary(conn)
            if boundary is not None and boundary < next_full:
                next_full = boundary  # the full pass applies the boundary in every pool
            await self._read_refills(conn)
            if self._dirty:
                continue
            wake = min([next_full, *self._refills.values()])
            pause = max(0.0, wake - time.monotonic())
            if retry:
                pause = min(pause, RETRY_LOCKED)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), pause)

    async def _read_refills(self, conn: asyncpg.Connection) -> None:
        """When (``time.monotonic()``) each pool whose queue waits for a rate key's units gets
        them back; a refill already due is passed at once (no margin: the pass's own clock,
        read under the pool lock, is the one that expires charges)."""
        now = time.monotonic()
        self._refills = {
            pool_id: now + seconds + (BOUNDARY_MARGIN if seconds > 0 else 0.0)
            for pool_id, seconds in (await db_reconcile.rate_refills(conn)).items()
        }

    async def _next_boundary(self, conn: asyncpg.Connection) -> float | None:
        """When (``time.monotonic()``) the next policy window opens or closes; None if never."""
        seconds = await db_reconcile.seconds_to_window_change(conn)
        if seconds is None:
            return None
        return time.monotonic() + max(0.0, seconds) + BOUNDARY_MARGIN

    def _failed(self, pool_id: UUID, exc: asyncpg.PostgresError) -> None:
        self.failures = [*self.failures[-99:], f"{pool_id}: {exc.sqlstate} {exc}"]
        log.error("reconcile pool %s failed (rolled back): %s", pool_id, exc)

    async def _maybe_analyze(self, conn: asyncpg.Connection) -> None:
        """Tables that have doubled since their statistics are analyzed, so that the plans every
        connection keeps are made again for their size (docs/ops.md, "Statistics of a young
        database")."""
        if time.monotonic() - self._last_analyze < ANALYZE_EVERY:
            return
        self._last_analyze = time.monotonic()
        try:
            tables = await db_reconcile.analyze_grown_tables(conn)
        except asyncpg.PostgresError as exc:  # (a statement timeout, say): the passes go on
            self._last_analyze += ANALYZE_RETRY - ANALYZE_EVERY
            log.warning("analyzing grown tables failed (next try in %.0fs): %s", ANALYZE_RETRY, exc)
            return
        if tables:
            self.analyzed = [*self.analyzed[-99:], *tables]
            log.info("analyzed grown tables: %s", ", ".join(tables))

    async def _maybe_prune(self, conn: asyncpg.Connection) -> None:
        """RESPOOL_RETENTION: delete terminal requests (and their events) older than it."""
        if self.retention is None or time.monotonic() - self._last_prune < PRUNE_EVERY:
            return
        self._last_prune = time.monotonic()
        pruned = await db_ops.prune_older_than(conn, self.retention, limit=10_000)
        if pruned:
            log.info(
                "retention: pruned %s terminal requests older than %ss", pruned, self.retention
            )
