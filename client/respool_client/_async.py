"""The async client: :class:`AsyncRespool` (one implementation; the sync client runs it).

The HTTP transport is in :mod:`respool_client._transport`, the plain calls in
:mod:`respool_client._verbs`, and ``allocate``'s wait/heartbeat/watch/release in
:mod:`respool_client._hold`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any

from respool_client._hold import QUEUE_LEASE, acquire, finish, start_holding
from respool_client._verbs import RequestVerbs
from respool_client.errors import RespoolError
from respool_client.grant import Grant, OnPreempted, Reservation

__all__ = ["AsyncRespool"]


class AsyncRespool(RequestVerbs):
    """Async client. Use as ``async with AsyncRespool(url, token) as rp:`` or call ``aclose``.

    Options: ``retry_for`` (60 s), ``backoff_base`` (0.1 s), ``backoff_max`` (5 s),
    ``request_timeout`` (30 s), ``transport`` (an ``httpx`` transport), and ``queue_lease``
    (:data:`~respool_client._hold.QUEUE_LEASE` s): while ``allocate`` waits, its queued request
    is heartbeated so that it loses its place this long after its waiter died (None: it keeps
    its place until cancelled); ``subject``: who :meth:`reserve` asks as (default: the
    ``RESPOOL_SUBJECT`` variable)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        queue_lease: int | None = QUEUE_LEASE,
        subject: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, token, **options)
        self.queue_lease = queue_lease
        self.subject = subject or os.environ.get("RESPOOL_SUBJECT") or None

    def _reserving(
        self,
        pool: str | None,
        resources: Mapping[str, int],
        subject: str | None,
        timeout: float | None,
        fields: dict[str, Any],
    ) -> Coroutine[Any, Any, Grant]:
        """The wait for :meth:`reserve`'s grant (a :class:`Reservation`), ``reserve``'s and the
        blocking client's; the subject is checked now, before it is awaited."""
        who = subject or self.subject
        if not who:
            raise RespoolError(
                "reserve needs a subject: pass subject=..., or set it on the client"
                " (subject=... or RESPOOL_SUBJECT)"
            )
        return acquire(
            self,
            who,
            within=timeout,
            queue_lease=self.queue_lease,
            kind=Reservation,
            pool=pool,
            resources=dict(resources),
            **fields,
        )

    @contextlib.asynccontextmanager
    async def reserve(
        self,
        *,
        pool: str | None = None,
        resources: Mapping[str, int],
        subject: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the allocation deadline
        heartbeat_interval: float | None = None,
        on_preempted: OnPreempted | None = None,
        **fields: Any,
    ) -> AsyncIterator[Reservation]:
        """Reserve units of rate keys (and any others) for the block (docs/rates.md): waits
        until they are granted (the pool's window has room), holds them, and releases at the
        end, settling what :meth:`~respool_client.grant.Reservation.settle` recorded::

            async with rp.reserve(pool="llm", resources={"llm_tokens": 4000}) as r:
                answer = await call_the_model(...)
                r.settle(llm_tokens=answer.usage.total_tokens)

        Without ``settle`` the estimate stays charged. ``fields``: those of
        :meth:`create_request`."""
        grant = await self._reserving(pool, resources, subject, timeout, fields)
        assert isinstance(grant, Reservation)
        beat = start_holding(self, grant, heartbeat_interval, on_preempted)
        try:
            yield grant
        except BaseException:
            await finish(self, grant, beat, quiet=True, used=grant.used)
            raise
        await finish(self, grant, beat, quiet=False, used=grant.used)

    async def __aenter__(self) -> AsyncRespool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @contextlib.asynccontextmanager
    async def allocate(
        self,
        subject: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the allocation deadline
        heartbeat_interval: float | None = None,
        on_preempted: OnPreempted | None = None,
        **fields: Any,
    ) -> AsyncIterator[Grant]:
        """Wait for an allocation, hold it (heartbeats) for the block, release it on exit.

        ``fields``: those of :meth:`create_request` (a misspelt one is a ``TypeError``); left
        out, the server's default; ``lease_seconds=None``: no lease; ``node_selector={"gpu-type":
        "A100-80G"}``: only nodes with these labels (``"node"``: the node's name), in a pool with
        nodes; ``preemption_group="run-42"``: never preempts an allocation of the same group
        (the other steps of one pipeline run). The grant's
        :attr:`~respool_client.Grant.placement` says where it runs and
        :meth:`~respool_client.Grant.env` gives the step's variables (``CUDA_VISIBLE_DEVICES``)."""
        grant = await acquire(self, subject, within=timeout, queue_lease=self.queue_lease, **fields)
        beat = start_holding(self, grant, heartbeat_interval, on_preempted)
        try:
            yield grant
        except BaseException:
            await finish(self, grant, beat, quiet=True)
            raise
        await finish(self, grant, beat, quiet=False)
