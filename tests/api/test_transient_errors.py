"""A transaction the database rolled back to break a deadlock or a serialization conflict is
never a 500: the data layer runs the call again a bounded number of times, and if the conflict
goes on the API answers 503 with Retry-After (docs/api.md, errors)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from app.db import errors as db_errors
from app.db.connect import APP_API, create_pool
from support.http import error
from support.server import Server, list_pools_failing


def _flaky(failures: int, kind: type[asyncpg.PostgresError]) -> tuple[Any, list[int]]:
    calls: list[int] = []

    @db_errors.engine_errors
    async def call(db: Any) -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise kind("rolled back to break a conflict")
        return "done"

    return call, calls


@pytest.mark.parametrize("kind", [asyncpg.DeadlockDetectedError, asyncpg.SerializationError])
async def test_a_rolled_back_call_runs_again(
    db_url: str, kind: type[asyncpg.PostgresError]
) -> None:
    pool = await create_pool(db_url, size=1, application_name=APP_API)
    try:
        call, calls = _flaky(db_errors.ATTEMPTS - 1, kind)
        assert await call(pool) == "done" and len(calls) == db_errors.ATTEMPTS
        call, calls = _flaky(db_errors.ATTEMPTS, kind)  # it goes on: bounded, then raised
        with pytest.raises(kind):
            await call(pool)
        assert len(calls) == db_errors.ATTEMPTS
        async with pool.acquire() as conn:
            call, calls = _flaky(1, kind)
            assert await call(conn) == "done"  # its own transaction: safe to run again
            call, calls = _flaky(1, kind)
            async with conn.transaction():  # the caller's transaction is lost: not retried
                with pytest.raises(kind):
                    await call(conn)
            assert len(calls) == 1
    finally:
        await pool.close()


async def test_a_lasting_conflict_is_503_with_retry_after(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    exc = asyncpg.DeadlockDetectedError("deadlock detected")
    r = await list_pools_failing(server, monkeypatch, exc)
    error(r, 503, None)
    assert r.headers["Retry-After"].isdigit()
