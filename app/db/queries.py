"""Typed wrappers around the SQL engine (sql/functions). Python calls SQL only from here.

Every call uses named notation, so arguments cannot be silently reordered, and every RPxxx
error comes back as an :mod:`app.db.errors` exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypeVar
from uuid import UUID

import asyncpg
import msgspec

from app.db.errors import engine_errors

Executor = asyncpg.Connection | asyncpg.Pool
Status = Literal[
    "queued", "allocated", "preempting", "released", "preempted", "expired", "cancelled", "rejected"
]
TERMINAL: frozenset[str] = frozenset({"released", "rejected", "cancelled", "expired", "preempted"})


class Pool(msgspec.Struct, frozen=True):
    id: UUID
    name: str
    description: str
    queueing: Literal["best_effort", "strict"]
    preemption_grace_seconds: int
    capacity: dict[str, int]
    usage: dict[str, int]
    queued: int
    created_at: datetime
    updated_at: datetime


class Policy(msgspec.Struct, frozen=True):
    id: UUID
    subject: str
    pool: str
    pool_id: UUID
    priority: int
    description: str
    reserved: dict[str, int]
    limit: dict[str, int]
    usage: dict[str, int]
    borrowed: dict[str, int]
    created_at: datetime
    updated_at: datetime


class Request(msgspec.Struct, frozen=True):
    id: UUID
    subject: str
    pool: str | None
    pool_id: UUID | None
    policy_id: UUID | None
    resources: dict[str, int]
    preemptible: bool
    priority: int
    status: Status
    reason: str | None
    message: str
    queue_position: int | None
    attempt: int
    max_retries: int
    lease_seconds: int | None
    lease_expires_at: datetime | None
    preempt_deadline: datetime | None
    idempotency_key: str | None
    labels: dict[str, str]
    version: int
    created_at: datetime
    updated_at: datetime
    allocated_at: datetime | None
    finished_at: datetime | None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class Event(msgspec.Struct, frozen=True, rename={"from_status": "from", "to_status": "to"}):
    from_status: str | None
    to_status: str
    reason: str | None
    attempt: int
    message: str
    at: datetime


class Created(msgspec.Struct, frozen=True):
    """A create_request answer: ``created`` is False for an idempotent replay."""

    created: bool
    request: Request


T = TypeVar("T")


def _as(kind: type[T], doc: Any) -> T:
    return msgspec.convert(doc, kind, strict=False)


# --- pools -----------------------------------------------------------------------------------


@engine_errors
async def create_pool(
    db: Executor,
    *,
    name: str,
    capacity: Mapping[str, Any] | None = None,
    description: str | None = "",
    queueing: str | None = "best_effort",
    preemption_grace_seconds: int | None = 0,
) -> Pool:
    doc = await db.fetchval(
        "SELECT respool.create_pool(p_name => $1, p_capacity => $2, p_description => $3,"
        " p_queueing => $4, p_preemption_grace_seconds => $5)",
        name,
        dict(capacity or {}),
        description,
        queueing,
        preemption_grace_seconds,
    )
    return _as(Pool, doc)


@engine_errors
async def update_pool(
    db: Executor,
    ref: str,
    *,
    capacity: Mapping[str, Any] | None = None,
    description: str | None = None,
    queueing: str | None = None,
    preemption_grace_seconds: int | None = None,
) -> Pool:
    doc = await db.fetchval(
        "SELECT respool.update_pool(p_ref => $1, p_capacity => $2, p_description => $3,"
        " p_queueing => $4, p_preemption_grace_seconds => $5)",
        ref,
        None if capacity is None else dict(capacity),
        description,
        queueing,
        preemption_grace_seconds,
    )
    return _as(Pool, doc)


@engine_errors
async def delete_pool(db: Executor, ref: str, *, force: bool = False) -> None:
    await db.execute("SELECT respool.delete_pool(p_ref => $1, p_force => $2)", ref, force)


@engine_errors
async def get_pool(db: Executor, ref: str) -> Pool:
    return _as(Pool, await db.fetchval("SELECT respool.get_pool(p_ref => $1)", ref))


@engine_errors
async def list_pools(db: Executor) -> list[Pool]:
    return _as(list[Pool], await db.fetchval("SELECT respool.list_pools()"))


# --- policies --------------------------------------------------------------------------------


@engine_errors
async def create_policy(
    db: Executor,
    *,
    subject: str,
    pool: str,
    priority: int | None = 0,
    reserved: Mapping[str, Any] | None = None,
    limit: Mapping[str, Any] | None = None,
    description: str | None = "",
) -> Policy:
    doc = await db.fetchval(
        "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_priority => $3,"
        " p_reserved => $4, p_limit => $5, p_description => $6)",
        subject,
        pool,
        priority,
        dict(reserved or {}),
        dict(limit or {}),
        description,
    )
    return _as(Policy, doc)


@engine_errors
async def update_policy(
    db: Executor,
    ref: str,
    *,
    priority: int | None = None,
    reserved: Mapping[str, Any] | None = None,
    limit: Mapping[str, Any] | None = None,
    description: str | None = None,
) -> Policy:
    doc = await db.fetchval(
        "SELECT respool.update_policy(p_ref => $1, p_priority => $2, p_reserved => $3,"
        " p_limit => $4, p_description => $5)",
        ref,
        priority,
        None if reserved is None else dict(reserved),
        None if limit is None else dict(limit),
        description,
    )
    return _as(Policy, doc)


@engine_errors
async def delete_policy(db: Executor, ref: str, *, force: bool = False) -> None:
    await db.execute("SELECT respool.delete_policy(p_ref => $1, p_force => $2)", ref, force)


@engine_errors
async def get_policy(db: Executor, ref: str) -> Policy:
    return _as(Policy, await db.fetchval("SELECT respool.get_policy(p_ref => $1)", ref))


@engine_errors
async def list_policies(
    db: Executor, *, pool: str | None = None, subject: str | None = None
) -> list[Policy]:
    doc = await db.fetchval(
        "SELECT respool.list_policies(p_pool => $1, p_subject => $2)", pool, subject
    )
    return _as(list[Policy], doc)


# --- requests --------------------------------------------------------------------------------


@engine_errors
async def create_request(
    db: Executor,
    *,
    subject: str,
    pool: str | None = None,
    resources: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None,
    preemptible: bool = True,
    max_retries: int = 0,
    lease_seconds: int | None = None,
    idempotency_key: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Created:
    """Create (or replay) a request; ``settings`` is ResourceSettings, converted in SQL."""
    row = await db.fetchrow(
        "SELECT created, request FROM respool.create_request(p_subject => $1, p_pool => $2,"
        " p_resources => $3, p_settings => $4, p_preemptible => $5, p_max_retries => $6,"
        " p_lease_seconds => $7, p_idempotency_key => $8, p_labels => $9)",
        subject,
        pool,
        None if resources is None else dict(resources),
        None if settings is None else dict(settings),
        preemptible,
        max_retries,
        lease_seconds,
        idempotency_key,
        None if labels is None else dict(labels),
    )
    assert row is not None
    return Created(created=row["created"], request=_as(Request, row["request"]))


# A request's JSON text straight into the Struct: no intermediate dict (the hot path of every
# long-poll read; measured: half of a woken waiter's Python time went into dict + convert).
_decode_request = msgspec.json.Decoder(Request, strict=False).decode


@engine_errors
async def get_request(db: Executor, request_id: UUID) -> Request:
    text = await db.fetchval("SELECT respool.get_request(p_id => $1)::text", request_id)
    return _decode_request(text)


@engine_errors
async def get_requests(db: Executor, request_ids: list[UUID]) -> dict[UUID, Request]:
    """Several requests in one query and one snapshot; unknown ids are left out."""
    rows = await db.fetch(
        "SELECT respool.request_json(p_id => u.id)::text FROM unnest($1::uuid[]) AS u(id)",
        request_ids,
    )
    found = (_decode_request(row[0]) for row in rows if row[0] is not None)
    return {r.id: r for r in found}


@engine_errors
async def list_requests(
    db: Executor,
    *,
    pool: str | None = None,
    subject: str | None = None,
    status: str | None = None,
    limit: int = 100,
    before: tuple[datetime, UUID] | None = None,
    subject_patterns: list[str] | None = None,
) -> list[Request]:
    """Newest first; ``before`` is the (created_at, id) of the last row of the previous page."""
    doc = await db.fetchval(
        "SELECT respool.list_requests(p_pool => $1, p_subject => $2, p_status => $3,"
        " p_limit => $4, p_before_created => $5, p_before_id => $6, p_subject_like => $7)",
        pool,
        subject,
        status,
        limit,
        before[0] if before else None,
        before[1] if before else None,
        subject_patterns,
    )
    return _as(list[Request], doc)


async def _request_action(db: Executor, fn: str, request_id: UUID, attempt: int | None) -> Request:
    # fn is one of a fixed set of function names below, never user input.
    doc = await db.fetchval(
        f"SELECT respool.{fn}(p_id => $1, p_attempt => $2)",
        request_id,
        attempt,
    )
    return _as(Request, doc)


@engine_errors
async def release_request(db: Executor, request_id: UUID, *, attempt: int | None = None) -> Request:
    return await _request_action(db, "release_request", request_id, attempt)


@engine_errors
async def cancel_request(db: Executor, request_id: UUID, *, attempt: int | None = None) -> Request:
    return await _request_action(db, "cancel_request", request_id, attempt)


@engine_errors
async def heartbeat_request(
    db: Executor, request_id: UUID, *, attempt: int | None = None
) -> Request:
    return await _request_action(db, "heartbeat_request", request_id, attempt)


@engine_errors
async def delete_request(db: Executor, request_id: UUID) -> None:
    await db.execute("SELECT respool.delete_request(p_id => $1)", request_id)


@engine_errors
async def request_events(db: Executor, request_id: UUID) -> list[Event]:
    doc = await db.fetchval("SELECT respool.list_request_events(p_id => $1)", request_id)
    return _as(list[Event], doc)


# --- engine steps the reconciler schedules ----------------------------------------------------


@engine_errors
async def allocate_pool(db: Executor, pool_id: UUID) -> int:
    """Grant what fits in one pool's queue; returns how many were granted."""
    return int(await db.fetchval("SELECT respool.allocate_pool(p_pool_id => $1)", pool_id))


@engine_errors
async def expire_leases(db: Executor, pool_id: UUID) -> int:
    """Expire lapsed leases in one pool; returns how many expired."""
    return int(await db.fetchval("SELECT respool.expire_leases(p_pool_id => $1)", pool_id))


class Violation(msgspec.Struct, frozen=True):
    invariant: str
    pool: str | None
    subject: str | None
    key: str
    detail: str


async def invariant_violations(db: Executor) -> list[Violation]:
    rows = await db.fetch(
        "SELECT invariant, pool, subject, key, detail FROM respool.invariant_violations"
    )
    return [Violation(**dict(r)) for r in rows]


# --- reconciler --------------------------------------------------------------------------------


async def pool_ids(db: Executor) -> list[UUID]:
    """Every pool's id, by pool name."""
    return [r["id"] for r in await db.fetch("SELECT id FROM respool.pools ORDER BY name")]


async def reconcile_pool(db: Executor, pool_id: UUID) -> dict[str, Any] | None:
    """One reconciler pass over one pool (its own transaction when ``db`` is not in one).

    None when the pool is gone or another transaction holds it (``SKIP LOCKED``).
    """
    doc: dict[str, Any] | None = await db.fetchval(
        "SELECT respool.reconcile_pool(p_pool_id => $1)", pool_id
    )
    return doc


async def pool_exists(db: Executor, pool_id: UUID) -> bool:
    return bool(
        await db.fetchval("SELECT EXISTS (SELECT FROM respool.pools WHERE id = $1)", pool_id)
    )
