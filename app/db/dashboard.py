"""The dashboard's read (``sql/queries/dashboard.sql``): pools with usage and policies, the
queue with what each entry waits for and its ETA, holdings, running jobs with the tail of their
output, recent events and invariant violations, all in one repeatable-read snapshot.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import msgspec
from respool_client.wire import Eta

from app.db.executor import Executor
from app.db.metrics import (
    PolicyRow,
    PoolKeyRow,
    connection,
    database_now,
    policy_rows,
    pool_key_rows,
)
from app.db.named import query
from app.db.reconcile import Violation, invariant_violations

__all__ = [
    "DashboardData",
    "DeviceRow",
    "EventRow",
    "HoldingRow",
    "JobRow",
    "NodeKeyRow",
    "NodeRow",
    "PoolRow",
    "QueueRow",
    "SliceRow",
    "dashboard_data",
]


class NodeKeyRow(msgspec.Struct, frozen=True):
    """One key of a node: its units allocated (``used``) out of ``capacity``; ``named``: the
    key has device ids (drawn one cell per device), else anonymous units (drawn as a bar)."""

    key: str
    capacity: int
    used: int
    named: bool


class SliceRow(msgspec.Struct, frozen=True):
    """A slice of a shared device and its holder (docs/placement.md, "Sharing a GPU")."""

    request_id: UUID
    subject: str
    memory_mb: int
    share: int | None  # null: no compute share promised


class DeviceRow(msgspec.Struct, frozen=True):
    """One named device of a node, in list order, and the request holding it whole (null: not
    held whole). A shared device has its ``sharing`` mode, its ``memory_mb`` offer to slices
    and its ``slices`` (largest first); a device of a key not shared: null, null and []."""

    key: str
    device: str
    request_id: UUID | None
    subject: str | None
    sharing: str | None = None
    memory_mb: int | None = None
    slices: list[SliceRow] = []


class NodeRow(msgspec.Struct, frozen=True):
    name: str
    state: str
    labels: dict[str, str]
    keys: list[NodeKeyRow]
    devices: list[DeviceRow]


class PoolRow(msgspec.Struct, frozen=True):
    name: str
    queueing: str
    preemption_grace_seconds: int
    keys: list[PoolKeyRow]
    policies: list[PolicyRow]
    queued: int
    holding: int
    # The machines backing the pool (docs/placement.md); empty: a pool of abstract units.
    nodes: list[NodeRow] = []


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
    # Its estimated wait in this pool (docs/scheduling.md, ETA); null: no estimate (no recorded
    # holds in the pool yet, or deeper in its queue than the engine estimates).
    eta: Eta | None


class HoldingRow(msgspec.Struct, frozen=True):
    pool: str
    subject: str
    request_id: UUID
    status: str
    resources: dict[str, int]
    preemptible: bool
    held_seconds: float
    labels: dict[str, str]


class JobRow(msgspec.Struct, frozen=True):
    """A running job (docs/jobs.md) and the tail of its current attempt's output: its last
    lines, stdout and stderr as they came (null: no output yet)."""

    request_id: UUID
    pool: str
    subject: str
    name: str
    status: str
    attempt: int
    node: str | None
    tail: str | None


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
    jobs: list[JobRow] = []


async def dashboard_data(
    db: Executor,
    *,
    queue_limit: int = 200,
    holdings_limit: int = 200,
    events_limit: int = 30,
    jobs_limit: int = 20,
    tail_lines: int = 20,
) -> DashboardData:
    """Everything the dashboard shows, read in one repeatable-read snapshot."""
    async with connection(db) as conn, conn.transaction(isolation="repeatable_read"):
        now = await database_now(conn)
        keys = await pool_key_rows(conn)
        policies = await policy_rows(conn)
        pools = await conn.fetch(query("dashboard_pools"))
        queue = await conn.fetch(
            query("dashboard_queue"),
            queue_limit,
        )
        holdings = await conn.fetch(
            query("dashboard_holdings"),
            holdings_limit,
        )
        events = await conn.fetch(
            query("dashboard_events"),
            events_limit,
        )
        nodes = await conn.fetch(query("dashboard_nodes"))
        jobs = await conn.fetch(query("dashboard_jobs"), jobs_limit, tail_lines)
        violations = await invariant_violations(conn)
    by_pool_keys: dict[str, list[PoolKeyRow]] = {}
    for k in keys:
        by_pool_keys.setdefault(k.pool, []).append(k)
    by_pool_policies: dict[str, list[PolicyRow]] = {}
    for p in policies:
        by_pool_policies.setdefault(p.pool, []).append(p)
    by_pool_nodes: dict[str, list[NodeRow]] = {}
    for n in nodes:
        row = msgspec.convert({k: n[k] for k in NodeRow.__struct_fields__}, NodeRow)
        by_pool_nodes.setdefault(n["pool"], []).append(row)
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
                nodes=by_pool_nodes.get(p["name"], []),
            )
            for p in pools
        ],
        queue=[msgspec.convert(dict(r), QueueRow) for r in queue],
        holdings=[msgspec.convert(dict(r), HoldingRow) for r in holdings],
        events=[msgspec.convert(dict(r), EventRow) for r in events],
        violations=violations,
        jobs=[msgspec.convert(dict(r), JobRow) for r in jobs],
    )
