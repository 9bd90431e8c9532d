"""Requests and their events (``sql/queries/requests.sql``): typed wrappers around the engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import msgspec
from respool_client.wire import Created, Event, Request, WhatIf

from app.db.errors import EngineError, engine_errors, error_for
from app.db.executor import Executor, _as
from app.db.named import query

# A create body as the engine takes it: the JSON text the client sent (msgspec.Raw, after the
# edge decoded it strictly), or a mapping of its fields. Its fields are checked, and its
# defaults filled, by the engine (respool._create_body), not here.
Body = msgspec.Raw | Mapping[str, Any]


def _document(body: Body) -> msgspec.Raw | dict[str, Any]:
    return body if isinstance(body, msgspec.Raw) else dict(body)


@engine_errors
async def create_request(
    db: Executor, body: Body, *, default_lease_seconds: int | None = None
) -> Created:
    """Create (or replay) a request from its create body; an absent ``lease_seconds`` is
    ``default_lease_seconds`` (None: no lease). The engine makes it as it makes a batch
    member, so a body is refused alike in both."""
    row = await db.fetchrow(query("create_request"), _document(body), default_lease_seconds)
    assert row is not None
    return Created(created=row["created"], request=_as(Request, row["request"]))


@engine_errors
async def what_if_request(
    db: Executor, body: Body, *, default_lease_seconds: int | None = None
) -> WhatIf:
    """What a create of ``body`` would answer now, plus ``would_preempt`` (docs/scheduling.md,
    what-if); nothing is kept."""
    doc = await db.fetchval(query("what_if_request"), _document(body), default_lease_seconds)
    return _as(WhatIf, doc)


# A request's JSON text straight into the Struct: no intermediate dict (the hot path of every
# long-poll read; measured: half of a woken waiter's Python time went into dict + convert).
_decode_request = msgspec.json.Decoder(Request, strict=False).decode
# A page likewise: 1,000 documents through json.loads + convert took ~4x msgspec's direct decode.
_decode_page = msgspec.json.Decoder(list[Request], strict=False).decode


@engine_errors
async def get_request(db: Executor, request_id: UUID) -> Request:
    return _decode_request(await db.fetchval(query("get_request"), request_id))


@engine_errors
async def get_requests(db: Executor, request_ids: list[UUID]) -> dict[UUID, Request]:
    """Several requests in one query and one snapshot, each as :func:`get_request` gives it
    (queued ones computed per pool, not one by one); unknown ids are left out."""
    rows = await db.fetch(query("get_requests"), request_ids)
    found = (_decode_request(row[0]) for row in rows)
    return {r.id: r for r in found}


class Seen(NamedTuple):
    """What a long-poll checks while it waits: a request's version and status."""

    version: int
    status: str


@engine_errors
async def request_versions(db: Executor, request_ids: list[UUID]) -> dict[UUID, Seen]:
    """The version and status of several requests (primary-key lookups, no document built);
    unknown ids are left out."""
    rows = await db.fetch(query("request_versions"), request_ids)
    return {row[0]: Seen(row[1], row[2]) for row in rows}


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
    gang_id: UUID | None = None,
) -> list[Request]:
    """Newest first; ``before`` is the (created_at, id) of the last row of the previous page;
    ``gang_id``: the members of one gang."""
    text = await db.fetchval(
        query("list_requests"),
        pool,
        subject,
        status,
        limit,
        before[0] if before else None,
        before[1] if before else None,
        subject_patterns,
        gang_id,
    )
    return _decode_page(text)


@engine_errors
async def release_request(
    db: Executor,
    request_id: UUID,
    *,
    attempt: int | None = None,
    used: Mapping[str, int] | None = None,
) -> Request:
    """Release (queued: cancel); ``used`` ({rate key: units}) settles its charges first
    (docs/rates.md)."""
    doc = await db.fetchval(
        query("release_request"), request_id, attempt, None if used is None else dict(used)
    )
    return _as(Request, doc)


@engine_errors
async def release_requests(
    db: Executor,
    releases: Sequence[tuple[UUID, int | None] | tuple[UUID, int | None, Mapping[str, int] | None]],
) -> list[Request | EngineError]:
    """Several releases, each ``(id, attempt)`` or ``(id, attempt, used)``, in one
    transaction: each ended exactly as :func:`release_request` would end it after the ones
    before it. One result per release, in order: its request, or the :class:`EngineError` its
    own call would have raised (unknown id, stale attempt, a refused settlement), that release
    changing nothing."""
    used = [dict(r[2]) if len(r) > 2 and r[2] is not None else None for r in releases]
    rows = await db.fetch(
        query("release_requests"),
        [r[0] for r in releases],
        [r[1] for r in releases],
        used if any(u is not None for u in used) else None,
    )
    return [
        _as(Request, row["request"])
        if row["error_code"] is None
        else error_for(row["error_code"], row["error_message"], row["error_field"])
        for row in rows
    ]


@engine_errors
async def cancel_request(db: Executor, request_id: UUID, *, attempt: int | None = None) -> Request:
    return _as(Request, await db.fetchval(query("cancel_request"), request_id, attempt))


@engine_errors
async def terminate_request(
    db: Executor, request_id: UUID, *, force: bool = False, reason: str = ""
) -> Request:
    """An admin ends the request (docs/preemption.md, "Terminate"): allocated, through
    ``preempting`` with the pool's grace (a non-preemptible one: Conflict unless ``force``);
    ``preempting`` with ``force``: ``preempted`` at once; queued: cancelled; terminal:
    unchanged. Never requeued; reason code ``terminated``, ``reason`` in its message."""
    doc = await db.fetchval(query("terminate_request"), request_id, force, reason)
    return _as(Request, doc)


@engine_errors
async def heartbeat_request(
    db: Executor,
    request_id: UUID,
    *,
    attempt: int | None = None,
    lease_seconds: int | None = None,
    queue_lease_seconds: int | None = None,
    usage: Mapping[str, int] | None = None,
) -> Request:
    """Extend the lease to now + ``lease_seconds`` (default: the request's own); queued: set
    the queue lease to now + ``queue_lease_seconds`` (default: the same length). ``usage``:
    the holder's use of its slices, ``{"gpu_memory_mb": N}`` (docs/placement.md, "Sharing a
    GPU": above a slice, an ``over_slice`` event, and its pool may terminate it)."""
    doc = await db.fetchval(
        query("heartbeat_request"),
        request_id,
        attempt,
        lease_seconds,
        queue_lease_seconds,
        None if usage is None else dict(usage),
    )
    return _as(Request, doc)


@engine_errors
async def delete_request(db: Executor, request_id: UUID) -> None:
    await db.execute(query("delete_request"), request_id)


@engine_errors
async def request_events(db: Executor, request_id: UUID) -> list[Event]:
    return _as(list[Event], await db.fetchval(query("request_events"), request_id))
