"""``POST /v1/retention/prune``: delete terminal requests older than a duration (admin only).

What ``respool request prune --older-than 7d`` calls; ``RESPOOL_RETENTION`` does the same from
the reconciler loop. Only terminal requests (released, rejected, cancelled, expired, preempted)
whose ``finished_at`` is older than the cutoff go, with their events (``respool.prune_requests``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec
from litestar import Controller, post
from litestar.datastructures import State
from respool_client.durations import parse_duration
from respool_client.wire import INT32_MAX

from app.api.common import AnyRequest, StrictBody, db, decode_body
from app.api.errors import ApiError, error_responses
from app.db import ops as db_ops

__all__ = ["PruneBody", "PruneResult", "RetentionController"]

# About 100 years: beyond that the cutoff would leave PostgreSQL's timestamp range.
MAX_AGE_SECONDS = 100 * 365 * 86400


class PruneBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``older_than``: a duration such as ``7d``, ``12h``, ``1h30m`` or a number of seconds."""

    older_than: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    limit: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] | None = None


class PruneResult(msgspec.Struct, kw_only=True):
    pruned: int
    before: datetime


class RetentionController(Controller):
    path = "/v1/retention"
    tags = ["retention"]

    @post(
        "/prune",
        status_code=200,
        summary="Delete terminal requests (and their events) finished more than older_than ago",
        responses=error_responses(400),
    )
    async def prune(
        self, state: State, request: AnyRequest, data: StrictBody[PruneBody]
    ) -> PruneResult:
        body = await decode_body(request, PruneBody)
        try:
            seconds = parse_duration(body.older_than)
        except ValueError as exc:
            raise ApiError(400, f"older_than: {exc}", "older_than") from None
        if seconds > MAX_AGE_SECONDS:
            raise ApiError(400, "older_than: at most 100 years", "older_than")
        pool = db(state)
        before = await db_ops.retention_cutoff(pool, seconds)
        pruned = await db_ops.prune_requests(pool, before, limit=body.limit)
        return PruneResult(pruned=pruned, before=before)
