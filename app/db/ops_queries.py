"""Operations queries: retention, the reader role, metrics and the dashboard (docs/ops.md).

Like :mod:`app.db.queries`, every call uses named arguments and engine errors come back as
:mod:`app.db.errors` exceptions. The read queries go through the ops views where those have what
is needed, and read base tables only for what the views do not carry (the dashboard's "waiting
for" sentence, event subjects).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import cast
from uuid import UUID

import asyncpg
import msgspec

from app.db.errors import engine_errors
from app.db.queries import Executor, Violation, invariant_violations

__all__ = [
    "DashboardData",
    "EventRow",
    "PolicyRow",
    "PoolKeyRow",
    "PoolRow",
    "QueueRow",
    "HoldingRow",
    "TallyRow",
    "dashboard_data",
    "grant_reader",
    "invariant_violation_counts",
    "policy_rows",
    "pool_key_rows",
    "prune_older_than",
    "prune_requests",
    "queue_stats",
    "retention_cutoff",
    "revoke_reader",
    "tally_events",
]


# --- retention -------------------------------------------------------------------------------


@engine_errors
async def prune_requests(db: Executor, before: datetime, *, limit: int | None = None) -> int:
    """Delete terminal requests finished before ``before`` (and their events); how many went.

    Queued, allocated and preempting requests are never touched (``respool.prune_requests``).
    ``limit`` bounds one call (oldest first); None deletes all that qualify.
    """
    n = await db.fetchval(
        "SELECT respool.prune_requests(p_before => $1, p_limit => $2)", before, limit
    )
    return int(n)


async def retention_cutoff(db: Executor, seconds: float) -> datetime:
    """``now() - seconds`` on the database clock."""
    cutoff: datetime = await db.fetchval(
        "SELECT now() - make_interval(secs => $1::double precision)", seconds
    )
    return cutoff


@engine_errors
async def prune_older_than(db: Executor, seconds: float, *, limit: int | None = None) -> int:
    """``prune_requests`` with ``before = now() - seconds`` on the database clock.

    This is what ``RESPOOL_RETENTION`` (``Settings.retention``, seconds) and
    ``respool request prune --older-than 7d`` (``app.durations.parse_duration``) call.
    """
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds!r}")
    n = await db.fetchval(
        "SELECT respool.prune_requests("
        "p_before => now() - make_interval(secs => $1::double precision), p_limit => $2)",
        seconds,
        limit,
    )
    return int(n)


# --- the reader role -------------------------------------------------------------------------


@engine_errors
async def grant_reader(
    db: Executor, role: str, *, statement_timeout_ms: int = 30_000, create: bool = False
) -> str:
    """Make ``role`` a respool_reader member (``respool.grant_reader``); returns a summary line."""
    text = await db.fetchval(
        "SELECT respool.grant_reader(p_role => $1, p_statement_timeout_ms => $2, p_create => $3)",
        role,
        statement_timeout_ms,
        create,
    )
    return str(text)


@engine_errors
async def revoke_reader(db: Executor, role: str) -> str:
    """Undo :func:`grant_reader` (``respool.revoke_reader``); returns a summary line."""
    return str(await db.fetchval("SELECT respool.revoke_reader(p_role => $1)", role))


# --- metrics ---------------------------------------------------------------------------------


class PoolKeyRow(msgspec.Struct, frozen=True):
    pool: str
    key: str
    capacity: int | None  # None: untracked soft key
    allocated: int
    free: int | None
    reserved: int  # sum of policies' reserved
    borrowed: int  # sum of policies' borrowed (used above reserved, tracked keys)
    queued_demand: int


async def pool_key_rows(db: Executor) -> list[PoolKeyRow]:
    """Per pool and key: ``respool.pool_usage`` plus reserved/borrowed sums of policy_usage."""
    rows = await db.fetch(
        "SELECT u.pool, u.key, u.capacity, u.allocated, u.free, u.queued_demand,"
        "       coalesce(p.reserved, 0) AS reserved, coalesce(p.borrowed, 0) AS borrowed"
        "  FROM respool.pool_usage u"
        "  LEFT JOIN (SELECT pool, key, sum(reserved) AS reserved, sum(borrowed) AS borrowed"
        "               FROM respool.policy_usage GROUP BY pool, key) p"
        "    ON p.pool = u.pool AND p.key = u.key"
        " ORDER BY u.pool, u.key"
    )
    return [
        PoolKeyRow(
            pool=r["pool"],
            key=r["key"],
            capacity=None if r["capacity"] is None else int(r["capacity"]),
            allocated=int(r["allocated"]),
            free=None if r["free"] is None else int(r["free"]),
            reserved=int(r["reserved"]),
            borrowed=int(r["borrowed"]),
            queued_demand=int(r["queued_demand"]),
        )
        for r in rows
    ]


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


async def policy_rows(db: Executor) -> list[PolicyRow]:
    rows = await db.fetch(
        'SELECT pool, subject, key, priority, reserved, "limit", used, borrowed, np_used'
        "  FROM respool.policy_usage ORDER BY pool, subject, key"
    )
    return [
        PolicyRow(
            pool=r["pool"],
            subject=r["subject"],
            key=r["key"],
            priority=int(r["priority"]),
            reserved=int(r["reserved"]),
            limit=None if r["limit"] is None else int(r["limit"]),
            used=int(r["used"]),
            borrowed=int(r["borrowed"]),
            np_used=int(r["np_used"]),
        )
        for r in rows
    ]


async def queue_stats(db: Executor) -> dict[str, tuple[int, float]]:
    """Per pool with a queue: (waiting requests, seconds the oldest has waited)."""
    rows = await db.fetch(
        "SELECT pool, count(*) AS n, max(waiting_seconds) AS oldest FROM respool.queue"
        " GROUP BY pool"
    )
    return {r["pool"]: (int(r["n"]), float(r["oldest"] or 0.0)) for r in rows}


async def invariant_violation_counts(db: Executor) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT invariant, count(*) AS n FROM respool.invariant_violations GROUP BY invariant"
    )
    return {r["invariant"]: int(r["n"]) for r in rows}


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
    async with _connection(db) as conn, conn.transaction(isolation="repeatable_read"):
        now = await conn.fetchval("SELECT now()")
        rows = await conn.fetch(
            "SELECT e.id, e.at, r.pool_name AS pool, e.to_status, e.reason,"
            "       (e.to_status = 'preempting' OR (e.to_status = 'preempted'"
            "        AND e.from_status IS DISTINCT FROM 'preempting')) AS preemption,"
            "       (e.to_status IN ('released', 'rejected', 'cancelled', 'expired')"
            "        OR (e.to_status = 'preempted' AND NOT EXISTS ("
            "            SELECT FROM respool.events n WHERE n.request_id = e.request_id"
            "               AND n.id > e.id AND n.from_status = 'preempted'))) AS final,"
            "       CASE WHEN e.to_status = 'allocated' THEN extract(epoch FROM e.at - ("
            "            SELECT q.at FROM respool.events q WHERE q.request_id = e.request_id"
            "               AND q.id < e.id AND q.to_status = 'queued'"
            "             ORDER BY q.id DESC LIMIT 1))::double precision END AS wait_seconds"
            "  FROM respool.events e JOIN respool.requests r ON r.id = e.request_id"
            " WHERE e.at >= $1"
            " ORDER BY e.id",
            since,
        )
    return now, [
        TallyRow(
            id=int(r["id"]),
            at=r["at"],
            pool=r["pool"],
            to_status=r["to_status"],
            reason=r["reason"],
            preemption=bool(r["preemption"]),
            final=bool(r["final"]),
            wait_seconds=r["wait_seconds"],
        )
        for r in rows
    ]


@contextlib.asynccontextmanager
async def _connection(db: Executor) -> AsyncIterator[asyncpg.Connection]:
    """The given connection, or one acquired from the given pool."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            # A pool connection proxy behaves as the connection it wraps.
            yield cast(asyncpg.Connection, conn)
    else:
        yield db


# --- dashboard -------------------------------------------------------------------------------


class PoolRow(msgspec.Struct, frozen=True):
    name: str
    queueing: str
    preemption_grace_seconds: int
    keys: list[PoolKeyRow]
    policies: list[PolicyRow]
    queued: int
    holding: int


class QueueRow(msgspec.Struct, frozen=True):
    pool: str
    position: int
    request_id: UUID
    subject: str
    resources: dict[str, int]
    preemptible: bool
    priority: int
    in_share: bool
    waiting_seconds: float
    waiting_for: str
    attempt: int
    labels: dict[str, str]


class HoldingRow(msgspec.Struct, frozen=True):
    pool: str
    subject: str
    request_id: UUID
    status: str
    resources: dict[str, int]
    preemptible: bool
    held_seconds: float
    labels: dict[str, str]


class EventRow(msgspec.Struct, frozen=True):
    id: int
    at: datetime
    request_id: UUID
    subject: str
    pool: str | None
    from_status: str | None
    to_status: str
    reason: str | None
    message: str


class DashboardData(msgspec.Struct, frozen=True):
    now: datetime
    pools: list[PoolRow]
    queue: list[QueueRow]
    holdings: list[HoldingRow]
    events: list[EventRow]
    violations: list[Violation]


async def dashboard_data(
    db: Executor, *, queue_limit: int = 200, holdings_limit: int = 200, events_limit: int = 30
) -> DashboardData:
    """Everything the dashboard shows, read in one repeatable-read snapshot."""
    async with _connection(db) as conn, conn.transaction(isolation="repeatable_read"):
        now = await conn.fetchval("SELECT now()")
        keys = await pool_key_rows(conn)
        policies = await policy_rows(conn)
        pools = await conn.fetch(
            "SELECT pl.name, pl.queueing, pl.preemption_grace_seconds,"
            "       (SELECT count(*) FROM respool.queue_entries e"
            "         WHERE e.pool_id = pl.id) AS queued,"
            "       (SELECT count(*) FROM respool.requests r WHERE r.pool_id = pl.id"
            "           AND r.status IN ('allocated', 'preempting')) AS holding"
            "  FROM respool.pools pl ORDER BY pl.name"
        )
        queue = await conn.fetch(
            "SELECT q.pool, q.position, q.request_id, q.subject, q.resources, q.preemptible,"
            "       q.priority, q.in_share, q.waiting_seconds, r.attempt, r.labels,"
            "       coalesce(respool._blocker(r.resources, r.preemptible, e.pool_id, e.policy_id),"
            "                'fits, waiting for its turn') AS waiting_for"
            "  FROM respool.queue q"
            "  JOIN respool.pools pl ON pl.name = q.pool"
            "  JOIN respool.queue_entries e ON e.pool_id = pl.id AND e.request_id = q.request_id"
            "  JOIN respool.requests r ON r.id = q.request_id"
            " ORDER BY q.pool, q.position LIMIT $1",
            queue_limit,
        )
        holdings = await conn.fetch(
            "SELECT pool, subject, request_id, status, resources, preemptible, held_seconds, labels"
            "  FROM respool.holdings ORDER BY pool, allocated_at DESC LIMIT $1",
            holdings_limit,
        )
        events = await conn.fetch(
            "SELECT e.id, e.at, e.request_id, r.subject, r.pool_name AS pool, e.from_status,"
            "       e.to_status, e.reason, e.message"
            "  FROM respool.events e JOIN respool.requests r ON r.id = e.request_id"
            " ORDER BY e.id DESC LIMIT $1",
            events_limit,
        )
        violations = await invariant_violations(conn)
    by_pool_keys: dict[str, list[PoolKeyRow]] = {}
    for k in keys:
        by_pool_keys.setdefault(k.pool, []).append(k)
    by_pool_policies: dict[str, list[PolicyRow]] = {}
    for p in policies:
        by_pool_policies.setdefault(p.pool, []).append(p)
    return DashboardData(
        now=now,
        pools=[
            PoolRow(
                name=p["name"],
                queueing=p["queueing"],
                preemption_grace_seconds=int(p["preemption_grace_seconds"]),
                keys=by_pool_keys.get(p["name"], []),
                policies=by_pool_policies.get(p["name"], []),
                queued=int(p["queued"]),
                holding=int(p["holding"]),
            )
            for p in pools
        ],
        queue=[msgspec.convert(dict(r), QueueRow) for r in queue],
        holdings=[msgspec.convert(dict(r), HoldingRow) for r in holdings],
        events=[msgspec.convert(dict(r), EventRow) for r in events],
        violations=violations,
    )
