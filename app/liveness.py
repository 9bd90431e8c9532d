"""Service liveness: each API process records itself alive every second (``respool.service_alive``).

A gap in that record is an outage of respool (the API or its database was down), during which no
holder could heartbeat. The first record after a gap gives every held lease and grace period the
gap back, in the same transaction; while the record is stale, nothing lapses
(``respool.leases_may_lapse``). See docs/preemption.md, "Outages".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg

from app.db.named import query

__all__ = ["TICK", "ServiceLiveness"]

TICK = 1.0  # seconds between records; respool.outage_threshold() is three of them

log = logging.getLogger("respool.liveness")


class ServiceLiveness:
    """Records this process alive every :data:`TICK` seconds on ``pool`` until stopped."""

    def __init__(self, pool: asyncpg.Pool, *, interval: float = TICK) -> None:
        self._pool = pool
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self.extended = 0  # leases given back their time by this process (for tests, logs)

    async def tick(self) -> dict[str, Any] | None:
        """One record; None when the database could not take it (retried next tick)."""
        try:
            doc: dict[str, Any] = await self._pool.fetchval(query("service_alive"))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.debug("liveness: not recorded (%s)", exc)
            return None
        if doc["leases"] or doc["grace_periods"]:
            self.extended += int(doc["leases"])
            log.warning(
                "respool was down for %.1f s: %s leases and %s grace periods extended by it",
                doc["gap_seconds"],
                doc["leases"],
                doc["grace_periods"],
            )
        return doc

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()

    async def start(self) -> None:
        """Record once now (before the API answers any heartbeat), then every tick."""
        await self.tick()
        self._task = asyncio.create_task(self._run(), name="respool-liveness")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
