"""``/v1/requests``: create (with long-poll), list (keyset pages), read (long-poll), act
(terminate: admin only)."""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal, cast
from uuid import UUID

import asyncpg
import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.enums import MediaType
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, QueryParameter
from respool_client.wire import (
    INT32_MAX,
    MAX_BATCH,
    MAX_SECONDS,
    Event,
    JobRelease,
    RequestCreate,
    RequestHeartbeat,
    RequestPage,
    RequestTerminate,
    Status,
    WhatIf,
)
from respool_client.wire import Request as ResourceRequest

from app import globs
from app.api.auth import (
    AuthError,
    Principal,
    listing_patterns,
    principal_of,
    require_subject,
    subject_reader,
)
from app.api.common import (
    AnyRequest,
    DecodedOnce,
    StrictBody,
    Wait,
    capped_wait,
    coalescer,
    db,
    decode_body,
    notifier,
    releases,
    settings,
)
from app.api.errors import ApiError, error_responses
from app.api.reader import RequestReader, encode
from app.db import jobs as db_jobs
from app.db import requests as db_requests
from app.db.requests import Seen
from app.logs import log_created

# Every waited request is re-read at least this often, whatever the notifications do.
POLL_BACKSTOP = 2.0

_Attempt = Annotated[
    int | None,
    QueryParameter(
        ge=1, le=INT32_MAX, description="Fencing: the attempt the client holds (409 if stale)"
    ),
]
_DryRun = Annotated[
    bool,
    QueryParameter(
        description="What-if: answer 200 with what a create would do now"
        " (plus would_preempt), from the real engine in a rolled-back transaction; nothing is kept"
    ),
]
_LeaseSeconds = Annotated[
    int | None,
    QueryParameter(
        ge=1,
        le=MAX_SECONDS,
        description="Seconds from now the lease (queued: the queue lease) runs; default: the"
        " request's lease_seconds",
    ),
]
_QueueLeaseSeconds = Annotated[
    int | None,
    QueryParameter(
        ge=1,
        le=MAX_SECONDS,
        description="Queued only: seconds from now the queue lease runs (default: as"
        " lease_seconds). An allocated request keeps its own lease length, so a waiting client"
        " whose heartbeat crosses the grant never shortens the allocation's lease",
    ),
]
_ACTION_ERRORS = error_responses(400, 404, 409)


async def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Terminate ends another holder's work: only an admin may call it."""
    principal = connection.scope.get("state", {}).get("principal")
    if isinstance(principal, Principal) and principal.role != "admin":
        raise AuthError(403, f"only an admin may terminate requests (token {principal.name!r})")


# --- cursors ---------------------------------------------------------------------------------


class _Cursor(msgspec.Struct, array_like=True):
    created_at: datetime
    id: UUID


def encode_cursor(created_at: datetime, request_id: FromPath[UUID]) -> str:
    raw = msgspec.json.encode(_Cursor(created_at, request_id))
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        c = msgspec.json.decode(raw, type=_Cursor)
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise ApiError(400, "cursor: not a cursor returned by this API", "cursor") from None
    if c.created_at.tzinfo is None:
        raise ApiError(400, "cursor: not a cursor returned by this API", "cursor")
    return c.created_at, c.id


# --- long-poll -------------------------------------------------------------------------------


async def wait_for(
    state: State, request_id: UUID, wait: float, done: Callable[[Seen], bool]
) -> bytes:
    """The request's JSON once ``done`` holds for its version and status, or after ``wait``
    seconds (then as it is).

    Register first, then read, then wait: no lost wake-up. While it waits, a waiter reads only
    the version and status (batched by primary key, no document built) and holds no DB
    connection; a notification whose payload says ``done`` skips even that. The document is
    read and encoded once for the answer (its bytes shared by the waiters of the same request),
    and ``done`` is checked again on it: a payload is only a hint.
    """
    pool, hub = db(state), notifier(state)
    reader = _reader(state, pool)
    deadline = time.monotonic() + wait
    with hub.waiter(request_id) as waiter:
        seen = await reader.seen.get(request_id)
        while seen is not None:  # None: unknown (or deleted meanwhile): the read below says 404
            waiter.seen = seen
            remaining = deadline - time.monotonic()
            final = remaining <= 0 or hub.closing
            if final or done(seen):
                answer = await reader.answer.get(request_id)
                if answer is None:
                    break
                if final or done(answer.seen):
                    return answer.body
                waiter.seen = answer.seen
            await waiter.wait(remaining)  # the notifier's backstop wakes it if a change slips by
            hint, waiter.hint = waiter.hint, None
            seen = hint if hint is not None and done(hint) else await reader.seen.get(request_id)
    return encode(await db_requests.get_request(pool, request_id))  # 404, unless it is back


def _encoded(body: bytes, status_code: int = 200) -> Response[ResourceRequest]:
    """An answer already encoded as JSON (the reader's bytes), sent as it is."""
    return Response(cast(ResourceRequest, body), media_type=MediaType.JSON, status_code=status_code)


def _reader(state: State, pool: asyncpg.Pool) -> RequestReader:
    """The app's coalescing reader for long-polls (made on first use, per pool)."""
    reader: RequestReader | None = getattr(state, "request_reader", None)
    if reader is None or reader.pool is not pool:
        reader = state.request_reader = RequestReader(pool)
        notifier(state).use_backstop(reader.versions, POLL_BACKSTOP)
    return reader


def visible_to(request: AnyRequest, what: WhatIf) -> WhatIf:
    """A what-if as the caller may see it: a client token learns the id and subject only of
    victims whose subject its patterns cover (like ``GET`` of that id); of the others, the pool
    and the resources."""
    p = principal_of(request)
    if p.role != "client":
        return what
    patterns = p.subject_patterns or ()
    victims = [
        v
        if v.subject is not None and globs.subject_matches(v.subject, patterns)
        else msgspec.structs.replace(v, id=None, subject=None)
        for v in what.would_preempt
    ]
    return msgspec.structs.replace(what, would_preempt=victims)


class RequestController(Controller):
    path = "/v1/requests"
    tags = ["requests"]

    @post(
        "/",
        summary="Create a request (201; 200 when an idempotency key replays an earlier one,"
        " or for a dry run)",
        responses={
            200: ResponseSpec(
                WhatIf,  # a Request with an optional would_preempt: a replay matches it too
                description="An earlier request with the same idempotency key and body; with"
                " dry_run=true, what a create would answer now plus would_preempt (a WhatIf)",
                generate_examples=False,
            ),
            **error_responses(400, 404, 422, 429),
        },
        # data arrives decoded once, strictly, from the raw body (app.api.common.DecodedOnce).
        dto=DecodedOnce[RequestCreate],
        return_dto=None,
    )
    async def create_request(
        self,
        state: State,
        request: AnyRequest,
        data: StrictBody[RequestCreate],
        wait: Wait = None,
        dry_run: _DryRun = False,
    ) -> Response[ResourceRequest]:  # a dry run answers a WhatIf, a Request subclass
        body: RequestCreate = data
        require_subject(request, body.subject)
        # The body goes to the engine whole, as the client sent it (now known to be well-formed):
        # the engine fills the defaults (an absent lease_seconds: the server's default lease).
        raw = await request.body()
        if dry_run:
            lease = settings(state).default_lease_seconds
            what = await db_requests.what_if_request(
                db(state), msgspec.Raw(raw), default_lease_seconds=lease
            )
            return Response(visible_to(request, what), status_code=200)
        # Made together with the creates waiting at the same time, in arrival order, each with
        # its own answer (app.api.coalesce; docs/api.md, "Coalesced creates").
        created = await coalescer(state).create(raw, body.subject)
        req = created.request
        if created.created:
            log_created(req)  # the engine does not notify a create's own changes
        status_code = 201 if created.created else 200
        seconds = capped_wait(state, wait)
        if seconds > 0 and req.status == "queued" and not notifier(state).closing:
            # The grant may have been committed before we registered: wait_for reads first.
            answer = await wait_for(state, req.id, seconds, lambda s: s.status != "queued")
            return _encoded(answer, status_code)
        return Response(req, status_code=status_code)

    @get(
        "/",
        summary="List requests, newest first, in pages",
        responses=error_responses(400, 404),
    )
    async def list_requests(
        self,
        state: State,
        request: Request[Any, Any, Any],
        pool: FromQuery[str | None] = None,
        subject: FromQuery[str | None] = None,
        status: Annotated[
            Status | Literal["live"] | None,
            QueryParameter(description="Only this status; live: queued, allocated and preempting"),
        ] = None,
        gang_id: Annotated[
            UUID | None,
            QueryParameter(description="Only the members of this gang (an all_or_nothing batch)"),
        ] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_BATCH, description="Page size")] = 100,
        cursor: Annotated[
            str | None, QueryParameter(description="next_cursor of the last page")
        ] = None,
    ) -> RequestPage:
        before = decode_cursor(cursor) if cursor else None
        items = await db_requests.list_requests(
            db(state),
            pool=pool,
            subject=subject,
            status=status,
            limit=limit,
            before=before,
            subject_patterns=listing_patterns(request),  # a client token sees its subjects only
            gang_id=gang_id,
        )
        next_cursor = None
        if len(items) == limit and items:
            last = items[-1]
            next_cursor = encode_cursor(last.created_at, last.id)
        return RequestPage(items=items, next_cursor=next_cursor)

    @get(
        "/{request_id:uuid}",
        summary="One request (long-poll with wait and version)",
        responses=error_responses(400, 404),
    )
    async def get_request(
        self,
        state: State,
        request_id: FromPath[UUID],
        wait: Wait = None,
        version: Annotated[
            int | None,
            QueryParameter(description="Answer once the version differs (default: current)"),
        ] = None,
    ) -> Response[ResourceRequest]:
        seconds = capped_wait(state, wait)
        if seconds <= 0:
            return Response(await db_requests.get_request(db(state), request_id))
        seen = version
        if seen is None:  # the current one (a change after this read still answers)
            now = await _reader(state, db(state)).seen.get(request_id)
            if now is None:
                return Response(await db_requests.get_request(db(state), request_id))  # 404
            seen = now.version
        return _encoded(await wait_for(state, request_id, seconds, lambda s: s.version != seen))

    @post(
        "/{request_id:uuid}/heartbeat",
        status_code=200,
        summary="Extend the lease (queued: set the queue lease); report the use of a slice",
        description=(
            "Allocated: the lease becomes now + lease_seconds (default: the request's own"
            " lease_seconds). Queued: sets a queue lease of the same length; a queued request"
            " whose queue lease lapses is cancelled with reason `abandoned`. An optional body"
            ' `{"usage": {"gpu_memory_mb": N}}` reports what the holder of a slice of a'
            " shared device uses now (MiB per `<K>_memory_mb` key it asked): use above the slice"
            " records an event with reason `over_slice` once per crossing, and when the pool's"
            " `slice_overuse` is `terminate` the holder is terminated (reason `over_slice`)."
            " See docs/placement.md, Sharing a GPU."
        ),
        responses=_ACTION_ERRORS,
    )
    async def heartbeat(
        self,
        state: State,
        request: AnyRequest,
        request_id: FromPath[UUID],
        attempt: _Attempt = None,
        lease_seconds: _LeaseSeconds = None,
        queue_lease_seconds: _QueueLeaseSeconds = None,
        data: StrictBody[RequestHeartbeat | None] = None,  # usage of a slice
    ) -> ResourceRequest:
        usage: dict[str, int] | None = None
        if (await request.body()).strip() not in (b"", b"null"):
            usage = (await decode_body(request, RequestHeartbeat)).usage
        return await db_requests.heartbeat_request(
            db(state),
            request_id,
            attempt=attempt,
            lease_seconds=lease_seconds,
            queue_lease_seconds=queue_lease_seconds,
            usage=usage,
        )

    @post(
        "/{request_id:uuid}/release",
        status_code=200,
        summary="Release (queued: cancel); a job's agent may report exit_code and reason",
        description=(
            "Allocated: released, its units given back and the queue granted in the same"
            " transaction; queued: cancelled; finished: unchanged. `used` ({rate key: units"
            " really used}) settles the request's charges of rate keys first: each becomes"
            " that amount at its original instant (a refund, or an extra charge that is"
            " recorded as an overrun). Without `used` the estimate stays charged. See"
            " docs/rates.md."
        ),
        responses=_ACTION_ERRORS,
    )
    async def release(
        self,
        state: State,
        request: AnyRequest,
        request_id: FromPath[UUID],
        attempt: _Attempt = None,
        data: StrictBody[JobRelease | None] = None,  # a job's run: exit_code, reason; used
    ) -> ResourceRequest:
        used: dict[str, int] | None = None
        if (await request.body()).strip() not in (b"", b"null"):
            ran = await decode_body(request, JobRelease)
            used = ran.used  # rate keys really used (docs/rates.md)
            if ran.exit_code is not None or ran.reason is not None:  # docs/jobs.md
                if used is not None:
                    raise ApiError(400, "used: a job's release settles no rate keys", "used")
                return await db_jobs.release_job(
                    db(state),
                    request_id,
                    attempt=attempt,
                    exit_code=ran.exit_code,
                    reason=ran.reason,
                )
        # Ended together with the releases waiting at the same time, each with its own answer
        # (app.api.coalesce; docs/api.md, "Coalesced releases").
        return await releases(state).release(request_id, attempt, used)

    @post(
        "/{request_id:uuid}/terminate",
        status_code=200,
        guards=[admin_only],
        summary="Terminate (admin only): end a request as a preemption would, never requeued",
        description=(
            "Allocated and preemptible: goes through `preempting` with the pool's grace period"
            " (none: `preempted` at once, its units granted to the queue in the same"
            " transaction), with its whole gang. Not preemptible: 409 unless `force`. Already"
            " `preempting`: `preempted` at once with `force`, else unchanged. Queued: `cancelled`."
            " Finished: unchanged. Reason code `terminated`; `reason` goes into the message;"
            " never requeued, whatever `max_retries`. See docs/preemption.md, Terminate."
        ),
        responses=_ACTION_ERRORS,
    )
    async def terminate(
        self,
        state: State,
        request: AnyRequest,
        request_id: FromPath[UUID],
        data: StrictBody[RequestTerminate | None] = None,  # no body: the defaults
    ) -> ResourceRequest:
        # No body (or null): the defaults, as the document's optional body says.
        absent = (await request.body()).strip() in (b"", b"null")
        body = RequestTerminate() if absent else await decode_body(request, RequestTerminate)
        if "\x00" in body.reason:  # PostgreSQL text cannot hold it: the engine never sees it
            raise ApiError(400, "reason: must not contain NUL characters", "reason")
        return await db_requests.terminate_request(
            db(state), request_id, force=body.force, reason=body.reason
        )

    @post("/{request_id:uuid}/cancel", status_code=200, summary="Cancel", responses=_ACTION_ERRORS)
    async def cancel(
        self, state: State, request_id: FromPath[UUID], attempt: _Attempt = None
    ) -> ResourceRequest:
        return await db_requests.cancel_request(db(state), request_id, attempt=attempt)

    @delete(
        "/{request_id:uuid}",
        status_code=204,
        summary="Delete a terminal request",
        responses=error_responses(404, 409),
    )
    async def delete_request(self, state: State, request_id: FromPath[UUID]) -> None:
        await db_requests.delete_request(db(state), request_id)

    @get(
        "/{request_id:uuid}/events",
        summary="The request's history",
        responses=error_responses(404),
    )
    async def events(
        self, state: State, request: AnyRequest, request_id: FromPath[UUID]
    ) -> list[Event]:
        may_read = subject_reader(request)
        return [
            e
            if e.cause_request_id is None or may_read(e.cause_subject)
            # another subject's request: a client token learns that there was one, not which
            else msgspec.structs.replace(e, cause_request_id=None, cause_subject=None)
            for e in await db_requests.request_events(db(state), request_id)
        ]
