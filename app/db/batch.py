"""Batch create (``sql/queries/batch.sql``, SPEC §11.5): many requests in one transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from respool_client.wire import Created, Request

from app.db.errors import engine_errors
from app.db.executor import Executor, _as
from app.db.named import query

__all__ = ["create_requests"]


@engine_errors
async def create_requests(
    db: Executor,
    members: Sequence[Mapping[str, Any]],
    *,
    all_or_nothing: bool = False,
    default_lease_seconds: int | None = None,
) -> list[Created]:
    """Create (or replay) every member, each a create body, in member order.

    A member without a ``lease_seconds`` key gets ``default_lease_seconds`` (an explicit None:
    no lease). Any bad member refuses the whole batch: the engine error names
    ``members[i].<field>`` and nothing is created.
    """
    rows = await db.fetch(
        query("create_requests"),
        [dict(m) if isinstance(m, Mapping) else m for m in members],  # the engine checks shapes
        all_or_nothing,
        default_lease_seconds,
    )
    return [Created(created=r["created"], request=_as(Request, r["request"])) for r in rows]
