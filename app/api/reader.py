"""Coalesced re-reads for woken long-polls.

One release can wake thousands of waiters at once (a large release grants many queued requests
in one transaction, and each granted request gets its own notification). Each woken waiter must
re-read its request; one query per waiter would queue thousands of round trips on the API's few
pooled connections. The reader batches them instead: the ids asked for while a batch is being
read go into the next batch, so a burst of N wakes costs about N / ``max_batch`` queries plus
one, and each read still starts after the wake that asked for it (it sees the change that
caused the wake).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any
from uuid import UUID

import asyncpg

from app.db import requests as db_requests
from app.db.queries import Request

__all__ = ["RequestReader"]


class RequestReader:
    """``await reader.get(request_id)``: the request as ``requests.get_request`` returns it."""

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 500, parallel: int = 2) -> None:
        self.pool = pool
        self._max_batch = max_batch
        self._parallel = parallel
        self._pending: dict[UUID, list[asyncio.Future[Request]]] = {}
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references
        self.batches = 0  # batch queries made (for tests and metrics)

    async def get(self, request_id: UUID) -> Request:
        future: asyncio.Future[Request] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(request_id, []).append(future)
        if self._running < self._parallel:
            self._running += 1
            self._spawn(self._drain())
        return await future

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        try:
            while self._pending:
                ids = list(self._pending)[: self._max_batch]
                batch = {rid: self._pending.pop(rid) for rid in ids}
                self.batches += 1
                try:
                    found = await db_requests.get_requests(self.pool, ids)
                except BaseException as exc:
                    for futures in batch.values():
                        for f in futures:
                            if not f.done():
                                f.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for rid, futures in batch.items():
                    doc = found.get(rid)
                    if doc is None:  # deleted meanwhile: the single read raises what the API maps
                        self._spawn(self._single(rid, futures))
                        continue
                    for f in futures:
                        if not f.done():
                            f.set_result(doc)
        finally:
            self._running -= 1

    async def _single(self, request_id: UUID, futures: list[asyncio.Future[Request]]) -> None:
        try:
            doc = await db_requests.get_request(self.pool, request_id)
        except Exception as exc:
            for f in futures:
                if not f.done():
                    f.set_exception(exc)
            return
        for f in futures:
            if not f.done():
                f.set_result(doc)
