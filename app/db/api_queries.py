"""Read-only queries the HTTP API needs beyond :mod:`app.db.queries` (metrics)."""

from __future__ import annotations

import msgspec

from app.db.queries import Executor

__all__ = ["PoolKeyUsage", "pool_key_usage", "request_counts"]


class PoolKeyUsage(msgspec.Struct, frozen=True):
    pool: str
    key: str
    capacity: int | None  # None: untracked soft key
    allocated: int
    queued_demand: int


async def pool_key_usage(db: Executor) -> list[PoolKeyUsage]:
    rows = await db.fetch(
        "SELECT pool, key, capacity, allocated, queued_demand FROM respool.pool_usage"
        " ORDER BY pool, key"
    )
    return [
        PoolKeyUsage(
            pool=r["pool"],
            key=r["key"],
            capacity=None if r["capacity"] is None else int(r["capacity"]),
            allocated=int(r["allocated"] or 0),
            queued_demand=int(r["queued_demand"] or 0),
        )
        for r in rows
    ]


async def request_counts(db: Executor) -> dict[str, int]:
    """Number of stored requests per status."""
    rows = await db.fetch("SELECT status, count(*) AS n FROM respool.requests GROUP BY status")
    return {r["status"]: int(r["n"]) for r in rows}
