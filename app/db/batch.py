"""Batch create (``sql/queries/batch.sql``): many requests in one transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from respool_client.wire import Created, Request

from app.db.errors import EngineError, engine_errors, error_for
from app.db.executor import Executor, _as
from app.db.named import query

__all__ = ["create_requests", "create_requests_each"]


@engine_errors
async def create_requests(
    db: Executor,
    members: msgspec.Raw | Sequence[Mapping[str, Any]],
    *,
    all_or_nothing: bool = False,
    default_lease_seconds: int | None = None,
    distinct_nodes: bool = False,
) -> list[Created]:
    """Create (or replay) every member, each a create body, in member order (``members``: the
    JSON array as the client sent it, or a sequence of mappings).

    A member without a ``lease_seconds`` key gets ``default_lease_seconds`` (an explicit None:
    no lease). Any bad member refuses the whole batch: the engine error names
    ``members[i].<field>`` and nothing is created. ``distinct_nodes`` (a gang only): every
    member on a different node.
    """
    rows = await db.fetch(
        query("create_requests"),
        members
        if isinstance(members, msgspec.Raw)
        else [dict(m) if isinstance(m, Mapping) else m for m in members],  # the engine checks
        all_or_nothing,
        default_lease_seconds,
        distinct_nodes,
    )
    return [Created(created=r["created"], request=_as(Request, r["request"])) for r in rows]


@engine_errors
async def create_requests_each(
    db: Executor, members: msgspec.Raw, *, default_lease_seconds: int | None = None
) -> list[Created | EngineError]:
    """Create (or replay) every member of ``members`` (a JSON array of create bodies) in one
    transaction, each exactly as its single create would right after the ones before it, in
    member order. One result per member, in order: what its single create answers, or the
    :class:`EngineError` that create would raise (the same class, message and field), that
    member changing nothing. Any other error fails the whole call."""
    rows = await db.fetch(query("create_requests_each"), members, default_lease_seconds)
    return [
        Created(created=r["created"], request=_as(Request, r["request"]))
        if r["error_code"] is None
        else error_for(r["error_code"], r["error_message"], r["error_field"])
        for r in rows
    ]
