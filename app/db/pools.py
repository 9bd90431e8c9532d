"""Pools (``sql/queries/pools.sql``): typed wrappers around the engine's pool functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from respool_client.wire import Pool

from app.db.errors import engine_errors
from app.db.executor import Executor, _as, fetch_as
from app.db.named import query


@engine_errors
async def create_pool(
    db: Executor,
    *,
    name: str,
    capacity: Mapping[str, Any] | None = None,
    description: str | None = "",
    queueing: str | None = "best_effort",
    preemption_grace_seconds: int | None = 0,
    starvation_seconds: int | None = 300,
    ordering: str | None = "fifo",
    placement: str | None = "pack",
    rates: Mapping[str, Any] | None = None,
    slice_overuse: str | None = "report",
) -> Pool:
    """Create a pool; ``starvation_seconds=None`` turns the starvation guard off;
    ``placement`` (pack, spread) chooses nodes once nodes back it; ``rates`` declares rate
    keys ``{key: {"amount", "per_seconds"}}`` (docs/rates.md); ``slice_overuse`` (report,
    terminate): what use above a slice of a shared device does (docs/placement.md)."""
    doc = await db.fetchval(
        query("create_pool"),
        name,
        dict(capacity or {}),
        description,
        queueing,
        preemption_grace_seconds,
        starvation_seconds,
        ordering,
        placement,
        _plain(rates),
        slice_overuse,
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
    starvation_seconds: int | None = None,
    starvation_off: bool = False,
    ordering: str | None = None,
    placement: str | None = None,
    rates: Mapping[str, Any] | None = None,
    slice_overuse: str | None = None,
) -> Pool:
    """Update a pool; ``None`` keeps a field, ``starvation_off`` turns the guard off. A
    ``capacity`` on a pool backed by nodes is a conflict (its capacity is theirs). ``rates``
    merge: a key's fields replace, a key set to None is no rate key any more."""
    doc = await db.fetchval(
        query("update_pool"),
        ref,
        None if capacity is None else dict(capacity),
        description,
        queueing,
        preemption_grace_seconds,
        starvation_seconds,
        starvation_off,
        ordering,
        placement,
        _plain(rates),
        slice_overuse,
    )
    return _as(Pool, doc)


def _plain(rates: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Rate keys as plain JSON values (Structs from a decoded body become objects)."""
    if rates is None:
        return None
    plain: dict[str, Any] = msgspec.to_builtins(dict(rates))
    return plain


@engine_errors
async def delete_pool(db: Executor, ref: str, *, force: bool = False) -> None:
    await db.execute(query("delete_pool"), ref, force)


@engine_errors
async def get_pool(db: Executor, ref: str) -> Pool:
    return await fetch_as(db, Pool, "get_pool", ref)


@engine_errors
async def list_pools(db: Executor) -> list[Pool]:
    return await fetch_as(db, list[Pool], "list_pools")
