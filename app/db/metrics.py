"""Metrics reads (``sql/queries/metrics.sql``): usage per pool, key and policy, each policy's
shape (active now, subjects a pattern covers), usage and state per node, queues, request counts,
invariant violations, and the events since the last scrape.

The reads go through the ops views where those have what is needed, and read base tables
only for what the views do not carry.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar, cast

import asyncpg
import msgspec

from app.db.executor import Executor, _as
from app.db.named import query

__all__ = [
    "DeviceRow",
    "NodeKeyRow",
    "NodeStateRow",
    "PoolKeyRow",
    "PolicyRow",
    "PolicyShapeRow",
    "TallyRow",
    "connection",
    "database_now",
    "device_rows",
    "invariant_violation_counts",
    "node_key_rows",
    "node_states",
    "policy_rows",
    "policy_shape_rows",
    "pool_key_rows",
    "queue_stats",
    "request_counts",
    "slice_overuse_rows",
    "tally_events",
]


class PoolKeyRow(msgspec.Struct, frozen=True):
    pool: str
    key: str
    capacity: int | None  # None: untracked soft key
    allocated: int
    free: int | None
    reserved: int  # sum of policies' reserved
    borrowed: int  # sum of policies' borrowed (used above reserved, tracked keys)
    queued_demand: int
    # a rate key (docs/rates.md): its window; allocated is what is charged inside it now
    per_seconds: int | None = None
    next_refill_at: datetime | None = None  # when the oldest charge inside leaves the window


Row = TypeVar("Row", bound=msgspec.Struct)


def _whole(row: asyncpg.Record) -> dict[str, Any]:
    """A row whose numeric sums (Decimals: a total of many amounts may pass 2^63) are ints."""
    return {k: int(v) if isinstance(v, Decimal) else v for k, v in row.items()}


def _query_rows(name: str, kind: type[Row]) -> Callable[[Executor], Awaitable[list[Row]]]:
    """The reader of the named query ``name``: its rows, each a ``kind`` (:func:`_whole`)."""

    async def read(db: Executor) -> list[Row]:
        return [_as(kind, _whole(r)) for r in await db.fetch(query(name))]

    return read


# Per pool and key: ``respool.pool_usage`` plus reserved/borrowed sums of policy_usage.
pool_key_rows = _query_rows("pool_key_rows", PoolKeyRow)


class NodeKeyRow(msgspec.Struct, frozen=True):
    """One node and key it tracks (docs/placement.md)."""

    pool: str | None  # None: a node in no pool
    node: str
    state: str
    key: str
    capacity: int
    allocated: int  # the node's counter
    free: int  # capacity - allocated: negative after a shrink until the reconciler acts


# Per node and key: ``respool.node_usage``.
node_key_rows = _query_rows("node_key_rows", NodeKeyRow)


class DeviceRow(msgspec.Struct, frozen=True):
    """One shared device of a node (docs/placement.md, "Sharing a GPU")."""

    pool: str | None  # None: a node in no pool
    node: str
    key: str
    device: str
    memory_mb: int  # its offer to slices: device memory less what it keeps back
    memory_used: int  # what its slices hold
    slices: int  # how many slices it has (each a holder)


# Per shared device: ``respool.device_usage``.
device_rows = _query_rows("device_rows", DeviceRow)


class NodeStateRow(msgspec.Struct, frozen=True):
    pool: str | None
    node: str
    state: str


# Every node (with or without capacity rows), its pool and state.
node_states = _query_rows("node_states", NodeStateRow)


class PolicyRow(msgspec.Struct, frozen=True):
    pool: str
    subject: str
    key: str
    priority: int
    reserved: int
    limit: int | None
    used: int
    borrowed: int
    np_used: int


policy_rows = _query_rows("policy_rows", PolicyRow)


class PolicyShapeRow(msgspec.Struct, frozen=True):
    """One policy's shape now (docs/preemption.md, "Policy shapes")."""

    pool: str
    subject: str  # a subject, or a pattern with *
    active: bool  # inside one of its windows now (always, without windows)
    covered_subjects: int | None  # a pattern: subjects holding or queued through it; else None


# Per policy, keys or not: ``active`` and, for a pattern, the subjects it covers now.
policy_shape_rows = _query_rows("policy_shape_rows", PolicyShapeRow)


class RateRow(msgspec.Struct, frozen=True):
    """A rate key of a pool (subject None) or a policy's counter of it (docs/rates.md)."""

    pool: str
    subject: str | None
    key: str
    amount: int | None  # a policy without a limit: None
    per_seconds: int
    used: int
    overrun: int
    refill_seconds: float


async def rate_rows(db: Executor) -> list[RateRow]:
    """``respool.rate_usage``, with the seconds until the next refill (0 when none is due)."""
    rows = await db.fetch(query("rate_rows"))
    return _as(list[RateRow], [_whole(r) for r in rows])


async def queue_stats(db: Executor) -> dict[str, tuple[int, float]]:
    """Per pool with a queue: (waiting requests, seconds the oldest has waited)."""
    rows = await db.fetch(query("queue_stats"))
    return {r["pool"]: (int(r["n"]), float(r["oldest"] or 0.0)) for r in rows}


async def invariant_violation_counts(db: Executor) -> dict[str, int]:
    rows = await db.fetch(query("invariant_violation_counts"))
    return {r["invariant"]: int(r["n"]) for r in rows}


class SliceOveruseRow(msgspec.Struct, frozen=True):
    """Holders of slices of one key in one pool above their slice now (docs/placement.md)."""

    pool: str
    key: str  # a <K>_memory_mb key
    holders: int
    over_mb: int  # MiB above their slices, summed


# Per pool and slice key with a report from a holder: who is above their slice now.
slice_overuse_rows = _query_rows("slice_overuse_rows", SliceOveruseRow)


class TallyRow(msgspec.Struct, frozen=True):
    """One status change, with what the metrics need to know about it."""

    id: int
    at: datetime
    pool: str | None
    to_status: str
    reason: str | None
    preemption: bool  # a preemption, counted once (preempting, or preempted without grace)
    final: bool  # the request's terminal status (a preempted request that was requeued: False)
    wait_seconds: float | None  # for a grant: time since it (re-)entered the queue


async def tally_events(db: Executor, since: datetime) -> tuple[datetime, list[TallyRow]]:
    """The database's ``now()`` and every event with ``at >= since`` (oldest first)."""
    async with connection(db) as conn, conn.transaction(isolation="repeatable_read"):
        now = await database_now(conn)
        rows = await conn.fetch(query("tally_events"), since)
    return now, _as(list[TallyRow], [dict(r) for r in rows])


@contextlib.asynccontextmanager
async def connection(db: Executor) -> AsyncIterator[asyncpg.Connection]:
    """The given connection, or one acquired from the given pool."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            # A pool connection proxy behaves as the connection it wraps.
            yield cast(asyncpg.Connection, conn)
    else:
        yield db


async def database_now(db: Executor) -> datetime:
    """The database clock: ``now()``, the current transaction's start time."""
    now: datetime = await db.fetchval(query("database_now"))
    return now


async def request_counts(db: Executor) -> dict[str, int]:
    """Number of stored requests per status."""
    rows = await db.fetch(query("request_counts"))
    return {r["status"]: int(r["n"]) for r in rows}
