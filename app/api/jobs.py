"""Jobs and agents (docs/jobs.md): the agent's routes (heartbeat, its jobs, claim, logs) and the
log reader. An agent token reaches only its node's jobs (:mod:`app.api.auth`); the long-polls
here wait on the notifier (:mod:`app.notify`) and hold no database connection while waiting."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar
from uuid import UUID

from litestar import Controller, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers.base import BaseRouteHandler
from litestar.params import FromPath, QueryParameter
from respool_client.wire import (
    INT32_MAX,
    AgentHeartbeat,
    AgentHeartbeatAnswer,
    AgentJobs,
    JobClaim,
    JobLogs,
    JobLogWrite,
    Request,
)

from app.api.auth import AuthError, Principal, principal_of
from app.api.common import (
    AnyRequest,
    StrictBody,
    Wait,
    capped_wait,
    db,
    decode_body,
    notifier,
    settings,
)
from app.api.errors import ApiError, error_responses
from app.db import jobs as db_jobs

__all__ = ["AgentController", "JobController", "agent_only"]

# A waiting agent or log follower reads again at least this often, whatever the notifications do.
POLL_BACKSTOP = 2.0

T = TypeVar("T")


async def agent_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Claims and log writes are for agent tokens: clients (and admins) cannot claim."""
    principal = connection.scope.get("state", {}).get("principal")
    if not isinstance(principal, Principal) or principal.role != "agent":
        name = principal.name if isinstance(principal, Principal) else "?"
        raise AuthError(403, f"only an agent token may do this (token {name!r})")


async def _long_poll(
    state: State,
    key: UUID,
    seconds: float,
    first: T,
    *,
    ready: Callable[[T], bool],
    read: Callable[[T], Awaitable[T]],
) -> T:
    """``first`` (the caller's read) if ``ready`` holds for it or there is no wait; otherwise
    ``read`` (given the previous answer) again until ``ready`` holds, ``seconds`` run out or
    shutdown begins, woken by the notifications keyed by ``key`` or every POLL_BACKSTOP seconds.

    Register, read, wait: a change committed between the read and the wait still wakes it."""
    if ready(first) or seconds <= 0:
        return first
    hub = notifier(state)
    deadline = time.monotonic() + seconds
    with hub.waiter(key) as waiter:
        found = await read(first)
        while not ready(found) and not hub.closing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await waiter.wait(min(remaining, POLL_BACKSTOP))
            found = await read(found)
    return found


def _agent(request: AnyRequest) -> Principal:
    p = principal_of(request)
    if p.role != "agent":
        raise AuthError(403, f"only an agent token may do this (token {p.name!r})")
    return p


class AgentController(Controller):
    path = "/v1/agent"
    tags = ["agents"]
    guards = [agent_only]

    @post(
        "/heartbeat",
        status_code=200,
        summary="Agent heartbeat: its node's agent is ready (lost after 3 silent intervals)",
        responses=error_responses(400, 403, 404),
    )
    async def heartbeat(
        self, state: State, request: AnyRequest, data: StrictBody[AgentHeartbeat]
    ) -> AgentHeartbeatAnswer:
        body = await decode_body(request, AgentHeartbeat)
        p = _agent(request)
        return await db_jobs.agent_heartbeat(
            db(state), node_id=p.node_id, pool_id=p.pool_id, interval_seconds=body.interval_seconds
        )

    @get(
        "/jobs",
        summary="The agent's jobs: allocated on its node and not claimed on this attempt"
        " (long-poll with wait); claimed=true: the ones it claimed that still hold units",
        responses=error_responses(400, 403),
    )
    async def jobs(
        self,
        state: State,
        request: AnyRequest,
        wait: Wait = None,
        claimed: Annotated[
            bool, QueryParameter(description="The jobs this agent claimed and still runs")
        ] = False,
    ) -> AgentJobs:
        p = _agent(request)
        pool = db(state)
        seconds = 0.0 if claimed else capped_wait(state, wait)
        items = await db_jobs.agent_jobs(
            pool, node_id=p.node_id, pool_id=p.pool_id, claimed=claimed
        )
        # A grant placed on its node wakes it (keyed by the node's id; a pool agent: the pool's).
        items = await _long_poll(
            state,
            p.node_id or p.pool_id or UUID(int=0),
            seconds,
            items,
            ready=bool,
            read=lambda _: db_jobs.agent_jobs(pool, node_id=p.node_id, pool_id=p.pool_id),
        )
        return AgentJobs(items=items)


class JobController(Controller):
    path = "/v1/requests"
    tags = ["requests"]

    @post(
        "/{request_id:uuid}/claim",
        status_code=200,
        guards=[agent_only],
        summary="Claim an attempt of a job (agent only; one claim per attempt)",
        description=(
            "The answer is the request document plus job.env, the environment's values: the only"
            " answer that carries them. 409 when the attempt is stale or already claimed, or the"
            " job no longer holds units; 404 for a job not placed on the agent's node."
        ),
        responses=error_responses(400, 403, 404, 409),
    )
    async def claim(
        self,
        state: State,
        request: AnyRequest,
        request_id: FromPath[UUID],
        data: StrictBody[JobClaim],
    ) -> Request:
        body = await decode_body(request, JobClaim)
        p = _agent(request)
        return await db_jobs.claim_job(
            db(state), request_id, attempt=body.attempt, node_id=p.node_id, pool_id=p.pool_id
        )

    @post(
        "/{request_id:uuid}/logs",
        status_code=204,
        guards=[agent_only],
        summary="Append an output chunk of an attempt (agent only)",
        description=(
            "Chunks are numbered by seq from 0 per attempt; a seq already stored is ignored (a"
            " retried send). At most RESPOOL_LOG_LIMIT bytes are kept per attempt: the first"
            " half and the last half, with a marker line between. 409 (field attempt) for an"
            " attempt that is not the job's current one: a stale attempt's output is refused like"
            " its heartbeat and release; 404 for a job the agent cannot see."
        ),
        responses=error_responses(400, 403, 404, 409),
    )
    async def append_log(
        self,
        state: State,
        request: AnyRequest,
        request_id: FromPath[UUID],
        data: StrictBody[JobLogWrite],
    ) -> None:
        body = await decode_body(request, JobLogWrite)
        if "\x00" in body.data:
            raise ApiError(400, "data: must not contain NUL characters", "data")
        await db_jobs.append_job_log(
            db(state),
            request_id,
            attempt=body.attempt,
            seq=body.seq,
            stream=body.stream,
            data=body.data,
            limit=settings(state).log_limit,
        )

    @get(
        "/{request_id:uuid}/logs",
        summary="A job's output of one attempt (long-poll with wait: follow)",
        responses=error_responses(400, 404),
    )
    async def logs(
        self,
        state: State,
        request_id: FromPath[UUID],
        attempt: Annotated[
            int | None,
            QueryParameter(ge=1, le=INT32_MAX, description="The attempt (default: the current)"),
        ] = None,
        after: Annotated[
            int, QueryParameter(ge=-1, le=INT32_MAX, description="Only chunks after this seq")
        ] = -1,
        wait: Wait = None,
    ) -> JobLogs:
        pool = db(state)
        seconds = capped_wait(state, wait)
        found = await db_jobs.job_logs(pool, request_id, attempt=attempt, after=after)
        # A chunk stored for the job wakes it (keyed by the request's id).
        return await _long_poll(
            state,
            request_id,
            seconds,
            found,
            ready=lambda f: bool(f.chunks) or f.done,
            read=lambda f: db_jobs.job_logs(pool, request_id, attempt=f.attempt, after=after),
        )
