"""The async client: :class:`AsyncRespool` (one implementation; the sync client runs it).

The HTTP transport is in :mod:`respool_client._transport`, the plain calls in
:mod:`respool_client._verbs`, and ``allocate``'s wait/heartbeat/watch/release in
:mod:`respool_client._hold`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from respool_client._hold import QUEUE_LEASE, acquire, finish, start_holding
from respool_client._verbs import RequestVerbs
from respool_client.grant import Grant, OnPreempted

__all__ = ["AsyncRespool"]


class AsyncRespool(RequestVerbs):
    """Async client. Use as ``async with AsyncRespool(url, token) as rp:`` or call ``aclose``.

    Options: ``retry_for`` (60 s), ``backoff_base`` (0.1 s), ``backoff_max`` (5 s),
    ``request_timeout`` (30 s), ``transport`` (an ``httpx`` transport), and ``queue_lease``
    (:data:`~respool_client._hold.QUEUE_LEASE` s): while ``allocate`` waits, its queued request
    is heartbeated so that it loses its place this long after its waiter died (None: it keeps
    its place until cancelled)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        queue_lease: int | None = QUEUE_LEASE,
        **options: Any,
    ) -> None:
        super().__init__(url, token, **options)
        self.queue_lease = queue_lease

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
