"""Coalesced creates: concurrent single ``POST /v1/requests`` made by one batch call
(docs/api.md, "Coalesced creates").

A create hands its body to the app's :class:`CreateCoalescer` and waits for its own answer. The
coalescer keeps the bodies in arrival order; up to ``flushers`` tasks at once (fewer than the
pool's connections, so reads, heartbeats and releases keep some) each take a connection, then
everything pending (at most a batch, 1,000), create it, answer each create, and go on while
anything is pending. A lone create (nothing else pending) is one ``respool.create_request``, as
without coalescing; two or more are one ``respool.create_requests_each`` call, subject by
subject (the subjects in the order of their first create, each subject's creates in arrival
order), which is then their queue order. Each create keeps its own answer (201 or 200, its
document), its idempotency key and its errors:

* a member the engine refuses gets its own row's error (``respool.create_requests_each`` answers
  one row per member: its document, or the code, field and message its single create would
  raise), rebuilt as that single create's error; it changes nothing and the others are created
  as their single creates would be, in order;
* a database that cannot serve (a lost connection, a timeout...) fails every create of the call
  with that error (the API answers 503, as it would each single create);
* any other error (an engine guard, a value PostgreSQL refuses) makes the coalescer create each
  member of that call alone, so each gets exactly its single create's answer.

The pending creates count in the pool's line of calls waiting for a connection
(:class:`app.db.connect.WaitLine`): past ``RESPOOL_MAX_PENDING`` a create is refused at once with
429, having changed nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Generic, TypeVar
from uuid import UUID

import asyncpg
import msgspec
from respool_client.wire import MAX_BATCH, Created, Request

from app.db import batch as db_batch
from app.db import requests as db_requests
from app.db.connect import QUEUE_TIMEOUT, DeadConnectionError, WaitLine
from app.db.errors import EngineError

__all__ = ["CreateCoalescer", "ReleaseCoalescer", "flushers_for"]

In = TypeVar("In")
Out = TypeVar("Out")

log = logging.getLogger("respool.api")

# Errors of a call that say the database could not serve it: every create of the call gets the
# error (503 in the API, app.api.errors); retrying member by member would only wait longer.
_DATABASE_DOWN: tuple[type[BaseException], ...] = (
    OSError,  # TimeoutError too
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.TransactionRollbackError,
    asyncpg.QueryCanceledError,  # a statement timeout
)


def flushers_for(pool_size: int) -> int:
    """How many batch calls run at once on a pool of ``pool_size`` connections: half of them, at
    least 1 and at most 4 (more only contend for the same pool locks), so the other half serves
    reads, heartbeats and releases during a burst of creates."""
    return max(1, min(4, pool_size // 2))


class _Pending(Generic[In, Out]):
    __slots__ = ("item", "future")

    def __init__(self, item: In, future: asyncio.Future[Out]) -> None:
        self.item = item
        self.future = future


class _Coalescer(Generic[In, Out]):
    """The line and the flushers both coalescers share: items handed to :meth:`_submit` wait in
    arrival order; up to ``flushers`` tasks at once each take a connection, then everything
    pending (at most ``batch_limit``), and :meth:`_run` answers each item's future."""

    name = "calls"

    def __init__(
        self, pool: asyncpg.Pool, *, flushers: int | None = None, batch_limit: int = MAX_BATCH
    ) -> None:
        self.pool = pool
        self.line: WaitLine = getattr(pool, "line", None) or WaitLine()
        self.flushers = flushers or flushers_for(pool.get_max_size())
        self.batch_limit = batch_limit
        self._pending: list[_Pending[In, Out]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = 0  # flushers under way (counted down as they end, not once reaped)
        self._waiting = 0  # flushers waiting for a connection (they will take what is pending)
        # What the coalescer did (for logs, tests and the bench): engine calls of each kind.
        self.singles = 0
        self.batches = 0
        self.largest = 0

    @property
    def pending(self) -> int:
        """Items waiting for a flusher to take them."""
        return len(self._pending)

    async def _submit(self, item: In) -> Out:
        """``item``'s answer once a flusher has run it; :class:`app.db.connect.PoolSaturated`
        at once when the line is full."""
        self.line.join()  # PoolSaturated (429) before anything is kept
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(item, future))
        if self._waiting == 0 and self._active < self.flushers:
            self._active += 1
            task = asyncio.create_task(self._flush(), name=f"respool-{self.name}-flusher")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    def _take(self) -> list[_Pending[In, Out]]:
        taken = self._pending[: self.batch_limit]
        del self._pending[: self.batch_limit]
        self.line.leave(len(taken))
        # An item whose client went away (its handler cancelled) is not run.
        return [p for p in taken if not p.future.done()]

    async def _flush(self) -> None:
        try:
            await self._flush_pending()
        finally:
            self._active -= 1  # at once: an item arriving next starts a new flusher

    async def _flush_pending(self) -> None:
        while self._pending:
            self._waiting += 1
            try:
                conn = await self.pool.acquire(timeout=QUEUE_TIMEOUT)
            except Exception as exc:
                # No connection (the database is down): every item waiting fails with it.
                while self._pending:
                    for p in self._take():
                        _fail(p, exc)
                return
            finally:
                self._waiting -= 1
            try:
                while self._pending and _usable(conn):
                    taken = self._take()
                    if taken:
                        await self._answer(conn, taken)
            finally:
                # A closed one is replaced by the pool; one the pool took back already (it was
                # closed or terminated meanwhile) needs nothing more.
                with contextlib.suppress(asyncpg.InterfaceError):
                    await self.pool.release(conn)

    async def _answer(self, conn: Any, taken: list[_Pending[In, Out]]) -> None:
        """Run ``taken`` on ``conn`` (:meth:`_run`); a call never sent goes back to the front of
        the line, any other error of the call fails every item of it."""
        try:
            if len(taken) == 1:
                self.singles += 1
            else:
                self.batches += 1
                self.largest = max(self.largest, len(taken))
            await self._run(conn, taken)
        except DeadConnectionError:
            # Never sent (app.db.connect): back to the front of the line, for the next
            # connection (this one is closed: the flusher takes another).
            self._pending[:0] = taken
            self.line.depth += len(taken)
        except BaseException as exc:
            for p in taken:
                _fail(p, exc)
            if not isinstance(exc, Exception):
                raise

    async def _run(self, conn: Any, taken: list[_Pending[In, Out]]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Wait for the calls under way (at shutdown, before the pool closes)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


PendingCreate = tuple[bytes, str]  # the body, its subject


def _by_subject(
    taken: list[_Pending[PendingCreate, Created]],
) -> list[_Pending[PendingCreate, Created]]:
    """``taken`` with the creates of each subject together, in arrival order within a subject,
    subjects in the order of their first create: alike requests then form runs the engine grants
    together (docs/api.md, "Coalesced creates")."""
    first: dict[str, int] = {}
    for i, p in enumerate(taken):
        first.setdefault(p.item[1], i)
    return sorted(taken, key=lambda p: first[p.item[1]])


class CreateCoalescer(_Coalescer[PendingCreate, Created]):
    """Creates the bodies handed to :meth:`create` through as few engine calls as the load allows
    (see the module docstring). One per app and pool."""

    name = "create"

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        default_lease_seconds: int | None,
        flushers: int | None = None,
        batch_limit: int = MAX_BATCH,
    ) -> None:
        super().__init__(pool, flushers=flushers, batch_limit=batch_limit)
        self.default_lease_seconds = default_lease_seconds

    async def create(self, body: bytes, subject: str) -> Created:
        """Create (or replay) the request of the create body ``body`` (JSON, already checked to
        be well-formed) for ``subject`` (its subject): its answer as a single create would give
        it, or its error. :class:`app.db.connect.PoolSaturated` at once when the line is full."""
        return await self._submit((body, subject))

    async def _run(self, conn: Any, taken: list[_Pending[PendingCreate, Created]]) -> None:
        """Create ``taken`` on ``conn`` and answer each create."""
        if len(taken) == 1:
            results: list[Created | EngineError] = [await self._single(conn, taken[0].item[0])]
        else:
            taken = _by_subject(taken)
            try:
                results = await self._batch(conn, taken)
            except _DATABASE_DOWN:
                raise
            except (EngineError, asyncpg.PostgresError):
                await self._one_by_one(conn, taken)
                return
        for p, result in zip(taken, results, strict=True):
            if isinstance(result, EngineError):
                _fail(p, result)
            elif not p.future.done():
                p.future.set_result(result)

    async def _one_by_one(self, conn: Any, taken: list[_Pending[PendingCreate, Created]]) -> None:
        """Each create alone, each answered with its own result or error."""
        log.info("coalesced create of %d failed as a whole: creating each alone", len(taken))
        for p in taken:
            try:
                result = await self._single(conn, p.item[0])
            except Exception as exc:  # noqa: BLE001 - that create's own error, for its handler
                _fail(p, exc)
            else:
                if not p.future.done():
                    p.future.set_result(result)

    async def _single(self, conn: Any, body: bytes) -> Created:
        return await db_requests.create_request(
            conn, msgspec.Raw(body), default_lease_seconds=self.default_lease_seconds
        )

    async def _batch(
        self, conn: Any, taken: list[_Pending[PendingCreate, Created]]
    ) -> list[Created | EngineError]:
        members = msgspec.Raw(b"[" + b",".join(p.item[0] for p in taken) + b"]")
        return await db_batch.create_requests_each(
            conn, members, default_lease_seconds=self.default_lease_seconds
        )


Release = tuple[UUID, int | None, dict[str, int] | None]  # id, attempt, used (rate keys)


class ReleaseCoalescer(_Coalescer[Release, Request]):
    """Releases handed to :meth:`release` through as few engine calls as the load allows: a
    lone one is ``respool.release_request``; two or more waiting together are one
    ``respool.release_requests`` call, which ends each exactly as its own call would, in arrival
    order, and answers each with its document or its own error (unknown id, stale attempt).
    One per app and pool (docs/api.md, "Coalesced releases")."""

    name = "release"

    async def release(
        self, request_id: UUID, attempt: int | None, used: dict[str, int] | None = None
    ) -> Request:
        """Release (a queued request: cancel) ``request_id``, fenced by ``attempt``, its rate
        keys settled with ``used`` (docs/rates.md): the answer its own release call would give,
        or its error."""
        return await self._submit((request_id, attempt, used))

    async def _run(self, conn: Any, taken: list[_Pending[Release, Request]]) -> None:
        if len(taken) == 1:
            request_id, attempt, used = taken[0].item
            results: list[Request | EngineError] = [
                await db_requests.release_request(conn, request_id, attempt=attempt, used=used)
            ]
        else:
            results = await db_requests.release_requests(conn, [p.item for p in taken])
        for p, result in zip(taken, results, strict=True):
            if isinstance(result, EngineError):
                _fail(p, result)
            elif not p.future.done():
                p.future.set_result(result)


def _usable(conn: Any) -> bool:
    """Whether a pooled connection can still run a call: open, and not taken back by its pool
    (asyncpg raises InterfaceError for a proxy the pool has released, at a pool's close)."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


def _fail(p: _Pending[Any, Any], exc: BaseException) -> None:
    if not p.future.done():
        p.future.set_exception(exc)
