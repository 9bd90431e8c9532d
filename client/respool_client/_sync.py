"""The sync client: :class:`Respool` runs :class:`AsyncRespool` on a private event loop in a
daemon thread (so a sync caller's heartbeats and ``on_preempted`` run on that thread)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar
from uuid import UUID

from respool_client._async import AsyncRespool
from respool_client._hold import acquire, finish, start_holding
from respool_client.errors import RespoolError
from respool_client.grant import Grant, OnPreempted, Reservation
from respool_client.wire import Request, RequestCreate, RequestPage

__all__ = ["Respool"]

T = TypeVar("T")


class _LoopThread:
    """A private event loop in a daemon thread; runs coroutines for the sync client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="respool-client", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Respool:
    """Sync client: :class:`AsyncRespool` on a private event loop thread.

    ``on_preempted`` callbacks run on that thread; keep them short."""

    def __init__(self, url: str, token: str | None = None, **options: Any) -> None:
        self._async = AsyncRespool(url, token, **options)
        self._loop: _LoopThread | None = _LoopThread()

    def __enter__(self) -> Respool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run(self._async.aclose())
            self._loop.close()
            self._loop = None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RespoolError("client is closed")
        return self._loop.run(coro)

    def call(self, method: str, path: str, **kw: Any) -> Any:
        """Same as :meth:`AsyncRespool.call`, blocking."""
        return self._run(self._async.call(method, path, **kw))

    def create_request(self, subject: str, *, wait: float | None = None, **fields: Any) -> Request:
        """Same as :meth:`AsyncRespool.create_request`, blocking."""
        return self._run(self._async.create_request(subject, wait=wait, **fields))

    def create_many(
        self, members: Sequence[RequestCreate], *, all_or_nothing: bool = False
    ) -> list[Request]:
        """Same as :meth:`AsyncRespool.create_many`, blocking."""
        return self._run(self._async.create_many(members, all_or_nothing=all_or_nothing))

    def get_request(
        self, request_id: UUID | str, *, wait: float | None = None, version: int | None = None
    ) -> Request:
        return self._run(self._async.get_request(request_id, wait=wait, version=version))

    def heartbeat(
        self,
        request_id: UUID | str,
        attempt: int | None = None,
        *,
        lease_seconds: int | None = None,
        queue_lease_seconds: int | None = None,
        usage: Mapping[str, int] | None = None,
    ) -> Request:
        return self._run(
            self._async.heartbeat(
                request_id,
                attempt,
                lease_seconds=lease_seconds,
                queue_lease_seconds=queue_lease_seconds,
                usage=usage,
            )
        )

    def list_requests(self, **filters: Any) -> RequestPage:
        return self._run(self._async.list_requests(**filters))

    def release(
        self,
        request_id: UUID | str,
        attempt: int | None = None,
        *,
        used: Mapping[str, int] | None = None,
    ) -> Request:
        """Same as :meth:`AsyncRespool.release`, blocking."""
        return self._run(self._async.release(request_id, attempt, used=used))

    def cancel(self, request_id: UUID | str, attempt: int | None = None) -> Request:
        return self._run(self._async.cancel(request_id, attempt))

    @contextlib.contextmanager
    def allocate(
        self,
        subject: str,
        *,
        timeout: float | None = None,
        heartbeat_interval: float | None = None,
        on_preempted: OnPreempted | None = None,
        **fields: Any,
    ) -> Iterator[Grant]:
        """Same as :meth:`AsyncRespool.allocate`, blocking."""
        core = self._async
        grant = self._run(
            acquire(core, subject, within=timeout, queue_lease=core.queue_lease, **fields)
        )
        with self._held(grant, heartbeat_interval, on_preempted):
            yield grant

    @contextlib.contextmanager
    def reserve(
        self,
        *,
        pool: str | None = None,
        resources: Mapping[str, int],
        subject: str | None = None,
        timeout: float | None = None,
        heartbeat_interval: float | None = None,
        on_preempted: OnPreempted | None = None,
        **fields: Any,
    ) -> Iterator[Reservation]:
        """Same as :meth:`AsyncRespool.reserve`, blocking::

        with rp.reserve(pool="llm", resources={"llm_tokens": 4000}) as r:
            answer = call_the_model(...)
            r.settle(llm_tokens=answer.usage.total_tokens)
        """
        core = self._async
        grant = self._run(core._reserving(pool, resources, subject, timeout, fields))
        assert isinstance(grant, Reservation)
        with self._held(grant, heartbeat_interval, on_preempted):
            yield grant

    @contextlib.contextmanager
    def _held(
        self,
        grant: Grant,
        heartbeat_interval: float | None,
        on_preempted: OnPreempted | None,
    ) -> Iterator[None]:
        """Heartbeats ``grant`` for the block, then releases it (settling a reservation's
        recorded use, docs/rates.md)."""
        core = self._async

        async def start() -> asyncio.Task[None]:
            return start_holding(core, grant, heartbeat_interval, on_preempted)

        beat = self._run(start())
        try:
            yield
        except BaseException:
            self._run(finish(core, grant, beat, quiet=True, used=_settled(grant)))
            raise
        self._run(finish(core, grant, beat, quiet=False, used=_settled(grant)))


def _settled(grant: Grant) -> dict[str, int] | None:
    """What a reservation recorded with ``settle`` by now (None for any other grant)."""
    return grant.used if isinstance(grant, Reservation) else None
