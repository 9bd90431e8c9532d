"""Operations (``sql/queries/ops.sql``): retention and the reader role (docs/ops.md)."""

from __future__ import annotations

from datetime import datetime

from app.db.errors import engine_errors
from app.db.executor import Executor
from app.db.named import query

# --- retention -------------------------------------------------------------------------------


@engine_errors
async def prune_requests(db: Executor, before: datetime, *, limit: int | None = None) -> int:
    """Delete terminal requests finished before ``before`` (and their events); how many went.

    Queued, allocated and preempting requests are never touched (``respool.prune_requests``).
    ``limit`` bounds one call (oldest first); None deletes all that qualify.
    """
    return int(await db.fetchval(query("prune_requests"), before, limit))


async def retention_cutoff(db: Executor, seconds: float) -> datetime:
    """``now() - seconds`` on the database clock."""
    cutoff: datetime = await db.fetchval(query("retention_cutoff"), seconds)
    return cutoff


@engine_errors
async def prune_older_than(db: Executor, seconds: float, *, limit: int | None = None) -> int:
    """``prune_requests`` with ``before = now() - seconds`` on the database clock.

    This is what ``RESPOOL_RETENTION`` (``Settings.retention``, seconds) and
    ``respool request prune --older-than 7d`` (``respool_client.durations.parse_duration``) call.
    """
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds!r}")
    return int(await db.fetchval(query("prune_older_than"), seconds, limit))


# --- the reader role -------------------------------------------------------------------------


@engine_errors
async def grant_reader(
    db: Executor, role: str, *, statement_timeout_ms: int = 30_000, create: bool = False
) -> str:
    """Make ``role`` a respool_reader member (``respool.grant_reader``); returns a summary line."""
    text = await db.fetchval(query("grant_reader"), role, statement_timeout_ms, create)
    return str(text)


@engine_errors
async def revoke_reader(db: Executor, role: str) -> str:
    """Undo :func:`grant_reader` (``respool.revoke_reader``); returns a summary line."""
    return str(await db.fetchval(query("revoke_reader"), role))
