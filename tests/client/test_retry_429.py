"""The client retries a 429 (the server's line of calls waiting for a database connection is
full, nothing done) like a 503, never sooner than ``Retry-After``, within ``retry_for``; the sync
client (``respool run``, the ZenML store) goes through the same transport. Against a real server
whose line is full for a while."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import time
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
from respool_client import ApiError, AsyncRespool, Respool
from respool_client._transport import MAX_RETRY_AFTER, Retrying, retry_after

from app.db.connect import WaitLine
from support.http import ok, pool_with_policy
from support.server import Server, running_server


class Heard:
    """A RetryListener that keeps what it hears, with the time."""

    def __init__(self) -> None:
        self.tries: list[tuple[float, Retrying]] = []
        self.answers: list[float] = []

    def retrying(self, notice: Retrying) -> None:
        self.tries.append((time.monotonic(), notice))

    def answered(self) -> None:
        self.answers.append(time.monotonic())


@contextlib.asynccontextmanager
async def full_line(server: Server) -> AsyncIterator[list[asyncio.Task[httpx.Response]]]:
    """The server's pool busy and its line of waiting calls full until the block ends."""
    pool: asyncpg.Pool = server.app.state.db
    line: WaitLine = server.app.state.db.line
    held = [await pool.acquire(timeout=10) for _ in range(pool.get_max_size())]
    waiting: list[asyncio.Task[httpx.Response]] = []
    try:
        while line.depth < line.limit:
            waiting.append(asyncio.create_task(server.client.get("/v1/pools")))
            await asyncio.sleep(0.02)
        yield waiting
    finally:
        for conn in held:
            await pool.release(conn)


async def test_a_429_is_retried_after_retry_after(db_url: str) -> None:
    async with running_server(db_url, db_pool_size=1, max_pending=1) as server:
        await pool_with_policy(server.client, capacity={"gpu": 1})
        heard = Heard()
        async with AsyncRespool(server.url, retry_for=30) as rp:
            rp.listener = heard
            async with full_line(server) as waiting:
                create = asyncio.create_task(rp.create_request("team", resources={"gpu": 1}))
                for _ in range(500):
                    if heard.tries:
                        break
                    await asyncio.sleep(0.01)
                refused_at, notice = heard.tries[0]
                assert "HTTP 429" in notice.problem and not create.done()
            made = await create
            await asyncio.gather(*waiting)
        assert made.status == "allocated"
        assert heard.answers and heard.answers[0] - refused_at >= 1.0  # Retry-After: 1
        page = ok(await server.client.get("/v1/requests"))["items"]
        assert [r["id"] for r in page] == [str(made.id)]


async def test_a_retry_after_past_the_budget_is_final(db_url: str) -> None:
    async with running_server(db_url, db_pool_size=1, max_pending=1) as server:
        heard = Heard()
        async with AsyncRespool(server.url, retry_for=0.5) as rp:
            rp.listener = heard
            async with full_line(server) as waiting:
                with pytest.raises(ApiError) as info:
                    await rp.list_requests()
            await asyncio.gather(*waiting)
        assert info.value.status_code == 429 and "RESPOOL_MAX_PENDING" in info.value.detail
        assert heard.tries == []  # no try was left within retry_for: it gave up at once


async def test_the_sync_client_retries_a_429(db_url: str) -> None:
    async with running_server(db_url, db_pool_size=1, max_pending=1) as server:
        await pool_with_policy(server.client, capacity={"gpu": 1})
        # The sync client blocks its caller: it runs in a thread, the server in this loop.
        rp = await asyncio.to_thread(Respool, server.url, retry_for=30)
        try:
            rp._async.listener = heard = Heard()
            async with full_line(server) as waiting:
                made = asyncio.create_task(
                    asyncio.to_thread(rp.create_request, "team", resources={"gpu": 1})
                )
                for _ in range(500):
                    if heard.tries:
                        break
                    await asyncio.sleep(0.01)
                assert heard.tries and "HTTP 429" in heard.tries[0][1].problem
            assert (await made).status == "allocated"
            await asyncio.gather(*waiting)
        finally:
            await asyncio.to_thread(rp.close)


def _answer(value: str | None) -> httpx.Response:
    return httpx.Response(429, headers={} if value is None else {"Retry-After": value})


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after(_answer(None)) == 0.0
    assert retry_after(_answer("3")) == 3.0
    assert retry_after(_answer("0.5")) == 0.5
    assert retry_after(_answer("-4")) == 0.0
    assert retry_after(_answer("soon")) == 0.0
    assert retry_after(_answer("nan")) == 0.0
    assert retry_after(_answer("86400")) == MAX_RETRY_AFTER
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25.0 <= retry_after(_answer(later)) <= 30.0
    earlier = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert retry_after(_answer(earlier)) == 0.0
