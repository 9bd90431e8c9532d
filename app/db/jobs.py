"""Jobs and agents (``sql/queries/jobs.sql``): typed wrappers around 048_jobs.sql (docs/jobs.md)."""

from __future__ import annotations

from uuid import UUID

from respool_client.wire import AgentHeartbeatAnswer, JobLogs, Request

from app.db.errors import engine_errors
from app.db.executor import Executor, fetch_as
from app.db.named import query

__all__ = [
    "agent_heartbeat",
    "agent_jobs",
    "agent_may_see",
    "append_job_log",
    "claim_job",
    "job_logs",
    "release_job",
]


@engine_errors
async def agent_may_see(
    db: Executor, request_id: UUID, *, node_id: UUID | None, pool_id: UUID | None
) -> bool:
    """Whether an agent bound to ``node_id`` (or ``pool_id``) may see the request."""
    return bool(await db.fetchval(query("agent_may_see"), request_id, node_id, pool_id))


@engine_errors
async def agent_jobs(
    db: Executor, *, node_id: UUID | None, pool_id: UUID | None, claimed: bool = False
) -> list[Request]:
    return await fetch_as(db, list[Request], "agent_jobs", node_id, pool_id, claimed)


@engine_errors
async def agent_heartbeat(
    db: Executor, *, node_id: UUID | None, pool_id: UUID | None, interval_seconds: int
) -> AgentHeartbeatAnswer:
    args = (node_id, pool_id, interval_seconds)
    return await fetch_as(db, AgentHeartbeatAnswer, "agent_heartbeat", *args)


@engine_errors
async def claim_job(
    db: Executor, request_id: UUID, *, attempt: int, node_id: UUID | None, pool_id: UUID | None
) -> Request:
    return await fetch_as(db, Request, "claim_job", request_id, attempt, node_id, pool_id)


@engine_errors
async def release_job(
    db: Executor,
    request_id: UUID,
    *,
    attempt: int | None,
    exit_code: int | None,
    reason: str | None,
) -> Request:
    return await fetch_as(db, Request, "release_job", request_id, attempt, exit_code, reason)


@engine_errors
async def append_job_log(
    db: Executor,
    request_id: UUID,
    *,
    attempt: int,
    seq: int,
    stream: str,
    data: str,
    limit: int,
) -> None:
    await db.execute(query("append_job_log"), request_id, attempt, seq, stream, data, limit)


@engine_errors
async def job_logs(
    db: Executor, request_id: UUID, *, attempt: int | None, after: int | None
) -> JobLogs:
    return await fetch_as(db, JobLogs, "job_logs", request_id, attempt, after)
