"""``POST /v1/requests/batch``: up to 1,000 create bodies in one transaction (docs/api.md)."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Controller, Request, post
from litestar.datastructures import State
from respool_client.wire import (
    RequestBatch,
    RequestBatchCreate,
    RequestCreate,
)

from app.api.auth import require_subject
from app.api.common import AnyRequest, StrictBody, db, decode_body, settings
from app.api.errors import ApiError, error_responses
from app.api.numbers import decimal_paths, refuse_string_decimals_in
from app.db import batch as db_batch
from app.logs import log_created

__all__ = ["BatchController"]


# msgspec and the API's error paths say "members.3.subject"; the batch names "members[3].subject".
_MEMBER = re.compile(r"\bmembers\.(\d+)")


def _member_path(text: str) -> str:
    return _MEMBER.sub(r"members[\1]", text)


async def _decode(request: Request[Any, Any, Any]) -> RequestBatchCreate:
    try:
        body = await decode_body(request, RequestBatchCreate)
    except ApiError as exc:
        field = _member_path(exc.field) if exc.field else None
        raise ApiError(exc.status_code, _member_path(exc.detail), field) from None
    # decode_body refuses strings for Decimal fields of the top-level Struct only; a member's
    # settings.cpu_count sits inside a list.
    if decimal_paths(RequestCreate) and any(m.settings is not None for m in body.members):
        doc = msgspec.json.decode(await request.body())
        for i, member in enumerate(doc["members"]):
            refuse_string_decimals_in(member, RequestCreate, prefix=f"members[{i}].")
    return body


class _Members(msgspec.Struct):
    """The members of a batch body as the client sent them (JSON text), for the engine."""

    members: msgspec.Raw


def _array_members(body: RequestBatchCreate, members: msgspec.Raw) -> msgspec.Raw:
    """An array batch (docs/jobs.md): member i's job gets array_index i and
    RESPOOL_ARRAY_INDEX=i in its environment; every member must carry a job."""
    missing = [i for i, m in enumerate(body.members) if m.job is None]
    if missing:
        raise ApiError(
            400, f"array: every member needs a job (members[{missing[0]}] has none)", "array"
        )
    docs = msgspec.json.decode(members)
    for i, doc in enumerate(docs):
        job = doc["job"]
        job["array_index"] = i
        job["env"] = {**(job.get("env") or {}), "RESPOOL_ARRAY_INDEX": str(i)}
    return msgspec.Raw(msgspec.json.encode(docs))


class BatchController(Controller):
    path = "/v1/requests/batch"
    tags = ["requests"]

    @post(
        "/",
        status_code=201,
        summary="Create 1 to 1,000 requests in one transaction",
        description=(
            "Each member is created exactly as a single create would be (its own validation, "
            "rejection, idempotency key, and grant where it fits), in member order, which is "
            "also their queue order. A malformed member refuses the whole batch (4xx naming "
            "members[i].field) and nothing is created. Members with an idempotency key that "
            "was already used answer the earlier request. With all_or_nothing the members are a "
            "gang (docs/scheduling.md): they must name the same subject, pool, preemptible and "
            "max_retries (else 400 naming members[i].field); they share a gang_id, are granted "
            "all together in one pool or not at all, and are rejected, preempted, expired and "
            "cancelled together. With distinct_nodes (a gang in a pool with nodes) every member "
            "is placed on a different node (docs/placement.md)."
        ),
        responses=error_responses(400, 403, 404, 422),
    )
    async def create_batch(
        self, state: State, request: AnyRequest, data: StrictBody[RequestBatchCreate]
    ) -> RequestBatch:
        body = await _decode(request)
        for member in body.members:
            require_subject(request, member.subject)  # every member's subject, before any work
        # The members go to the engine whole, as the client sent them (now known to be
        # well-formed): the engine fills the defaults, as for a single create.
        members = msgspec.json.decode(await request.body(), type=_Members).members
        if body.array:
            members = _array_members(body, members)
        made = await db_batch.create_requests(
            db(state),
            members,
            all_or_nothing=body.all_or_nothing,
            default_lease_seconds=settings(state).default_lease_seconds,
            distinct_nodes=body.distinct_nodes,
        )
        for m in made:
            if m.created:
                log_created(m.request)  # the engine does not notify a create's own changes
        return RequestBatch(items=[m.request for m in made])
