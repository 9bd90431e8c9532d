"""What the reconciler runs (``sql/queries/reconcile.sql``): per-pool passes and engine steps,
and the invariant check.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import msgspec

from app.db.errors import engine_errors
from app.db.executor import Executor
from app.db.named import query


async def pool_ids(db: Executor) -> list[UUID]:
    """Every pool's id, by pool name."""
    return [r["id"] for r in await db.fetch(query("pool_ids"))]


async def pool_exists(db: Executor, pool_id: UUID) -> bool:
    return bool(await db.fetchval(query("pool_exists"), pool_id))


async def reconcile_pool(db: Executor, pool_id: UUID) -> dict[str, Any] | None:
    """One reconciler pass over one pool (its own transaction when ``db`` is not in one).

    None when the pool is gone or another transaction holds it (``SKIP LOCKED``).
    """
    doc: dict[str, Any] | None = await db.fetchval(query("reconcile_pool"), pool_id)
    return doc


@engine_errors
async def allocate_pool(db: Executor, pool_id: UUID) -> int:
    """Grant what fits in one pool's queue; returns how many were granted."""
    return int(await db.fetchval(query("allocate_pool"), pool_id))


@engine_errors
async def expire_leases(db: Executor, pool_id: UUID) -> int:
    """Expire lapsed leases in one pool; returns how many expired."""
    return int(await db.fetchval(query("expire_leases"), pool_id))


class Violation(msgspec.Struct, frozen=True):
    invariant: str
    pool: str | None
    subject: str | None
    key: str
    detail: str


async def invariant_violations(db: Executor) -> list[Violation]:
    """Every broken accounting invariant (empty when all hold)."""
    return [Violation(**dict(r)) for r in await db.fetch(query("invariant_violations"))]


async def existing_pool_ids(db: Executor, pool_ids: list[UUID]) -> set[UUID]:
    """Which of ``pool_ids`` are pools that exist."""
    return {r["id"] for r in await db.fetch(query("existing_pool_ids"), pool_ids)}


async def rate_refills(db: Executor) -> dict[UUID, float]:
    """Per pool whose queue waits for a rate key's units (docs/rates.md): seconds until
    enough charges have left their window for a queue head, by the database's clock."""
    return {r["pool_id"]: r["seconds"] for r in await db.fetch(query("rate_refills"))}


async def seconds_to_window_change(db: Executor) -> float | None:
    """Seconds until a policy's window next opens or closes, over every pool, by the database's
    clock (None: no boundary ahead)."""
    seconds: float | None = await db.fetchval(query("seconds_to_window_change"))
    return seconds


async def analyze_grown_tables(db: Executor) -> list[str]:
    """The respool tables analyzed because they have doubled since their statistics."""
    return list(await db.fetchval(query("analyze_grown_tables")))
