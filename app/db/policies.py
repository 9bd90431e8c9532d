"""Policies (``sql/queries/policies.sql``): typed wrappers around the engine's policy functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType
from respool_client.wire import Policy, PolicyWindow

from app.db.errors import engine_errors
from app.db.executor import Executor, _as, fetch_as
from app.db.named import query

WindowsIn = Sequence[PolicyWindow | Mapping[str, Any]]


def _windows_json(windows: WindowsIn | None) -> list[Any] | None:
    """Windows as JSON values for the jsonb codec (it takes builtins, not Structs)."""
    return None if windows is None else msgspec.to_builtins(list(windows))


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
    priority_lane: bool | None = False,
    windows: WindowsIn | None = None,
) -> Policy:
    """``windows``: None is always active (docs/preemption.md, "Time windows")."""
    doc = await db.fetchval(
        query("create_policy"),
        subject,
        pool,
        priority,
        dict(reserved or {}),
        dict(limit or {}),
        description,
        priority_lane,
        _windows_json(windows),
    )
    return _as(Policy, doc)


@engine_errors
async def get_policy(db: Executor, ref: str) -> Policy:
    return await fetch_as(db, Policy, "get_policy", ref)


@engine_errors
async def update_policy(
    db: Executor,
    ref: str,
    *,
    priority: int | None = None,
    reserved: Mapping[str, Any] | None = None,
    limit: Mapping[str, Any] | None = None,
    description: str | None = None,
    priority_lane: bool | None = None,
    windows: WindowsIn | None | UnsetType = UNSET,
) -> Policy:
    """``windows``: UNSET keeps them, None removes them (always active), a list replaces them."""
    doc = await db.fetchval(
        query("update_policy"),
        ref,
        priority,
        None if reserved is None else dict(reserved),
        None if limit is None else dict(limit),
        description,
        priority_lane,
        None if windows is UNSET or windows is None else _windows_json(windows),
        windows is None,
    )
    return _as(Policy, doc)


@engine_errors
async def delete_policy(db: Executor, ref: str, *, force: bool = False) -> None:
    await db.execute(query("delete_policy"), ref, force)


@engine_errors
async def list_policies(
    db: Executor, *, pool: str | None = None, subject: str | None = None
) -> list[Policy]:
    return _as(list[Policy], await db.fetchval(query("list_policies"), pool, subject))
