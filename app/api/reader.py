"""Coalesced reads for long-polls: many waiters, few queries.

One release can wake thousands of waiters at once (a large release grants many queued requests
in one transaction, and each granted request gets its own notification), and thousands of
long-polls can register at once. Each waiter must read its request; one query per waiter would
queue thousands of round trips on the API's few pooled connections. A :class:`Batcher` batches
them instead: the ids asked for while a batch is being read go into the next batch, so a burst
of N reads costs about N / ``max_batch`` queries plus one, and each read still starts after the
call that asked for it (a read asked for after a wake sees the change that caused the wake).

:class:`RequestReader` has two: ``seen`` reads only a request's version and status (by primary
key: what a waiter checks while it waits), ``answer`` reads the whole document and encodes it
once (the bytes the API answers, shared by every waiter of the same request in the batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Generic, NamedTuple, TypeVar
from uuid import UUID

import asyncpg
import msgspec

from app.db import requests as db_requests
from app.db.requests import Seen

__all__ = ["Answer", "Batcher", "RequestReader", "encode"]

T = TypeVar("T")

encode = msgspec.json.Encoder().encode  # a Request as Litestar encodes it (the same bytes)


class Batcher(Generic[T]):
    """``await batcher.get(request_id)``: ``fetch``'s value for the id (None when absent)."""

    def __init__(
        self,
        fetch: Callable[[list[UUID]], Awaitable[Mapping[UUID, T]]],
        *,
        max_batch: int = 500,
        parallel: int = 2,
    ) -> None:
        self._fetch = fetch
        self._max_batch = max_batch
        self._parallel = parallel
        self._pending: dict[UUID, list[asyncio.Future[T | None]]] = {}
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references
        self.batches = 0  # batch queries made (for tests and metrics)

    async def get(self, request_id: UUID) -> T | None:
        future: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(request_id, []).append(future)
        if self._running < self._parallel:
            self._running += 1
            task = asyncio.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                ids = list(self._pending)[: self._max_batch]
                batch = {rid: self._pending.pop(rid) for rid in ids}
                self.batches += 1
                try:
                    found = await self._fetch(ids)
                except BaseException as exc:
                    for futures in batch.values():
                        for f in futures:
                            if not f.done():
                                f.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for rid, futures in batch.items():
                    value = found.get(rid)
                    for f in futures:
                        if not f.done():  # a waiter whose call was cancelled is skipped
                            f.set_result(value)
        finally:
            self._running -= 1


class Answer(NamedTuple):
    """A request's encoded JSON, and its version and status as that document has them."""

    seen: Seen
    body: bytes


class RequestReader:
    """The batched reads of one pool's long-polls: ``seen`` and ``answer`` (module docstring)."""

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 500, parallel: int = 2) -> None:
        self.pool = pool
        self.seen: Batcher[Seen] = Batcher(self.versions, max_batch=max_batch, parallel=parallel)
        self.answer: Batcher[Answer] = Batcher(
            self._answers, max_batch=max_batch, parallel=parallel
        )

    async def versions(self, ids: list[UUID]) -> dict[UUID, Seen]:
        """The version and status of those of ``ids`` that exist (one query)."""
        return await db_requests.request_versions(self.pool, ids)

    async def _answers(self, ids: list[UUID]) -> dict[UUID, Answer]:
        found = await db_requests.get_requests(self.pool, ids)
        return {rid: Answer(Seen(r.version, r.status), encode(r)) for rid, r in found.items()}
