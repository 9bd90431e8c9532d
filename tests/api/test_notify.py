"""app.notify.Notifier on its own: backoff on connect failures, wake-ups, shutdown."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from app.db.connect import APP_LISTENER, connect
from app.notify import CHANNEL, Notifier


async def test_retries_until_the_database_answers_then_wakes(db_url: str) -> None:
    attempts = 0

    async def flaky() -> asyncpg.Connection:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise OSError("connection refused")
        return await connect(db_url, application_name=APP_LISTENER)

    n = Notifier(connector=flaky, backoff_initial=0.01, backoff_max=0.05)
    await n.start(ready_timeout=5)
    try:
        assert attempts == 3 and n.healthy
        rid = uuid.uuid4()
        other = await asyncpg.connect(db_url)
        try:
            with n.waiter(rid) as w:
                await other.execute("SELECT pg_notify($1, 'not json')", CHANNEL)  # ignored
                assert not await w.wait(0.2)
                payload = f'{{"id": "{rid}", "status": "allocated", "version": 2, "pool": "p"}}'
                await other.execute("SELECT pg_notify($1, $2)", CHANNEL, payload)
                assert await w.wait(2)
        finally:
            await other.close()
        assert n.waiting == 0
    finally:
        await n.close()
    assert not n.healthy and n.closing


async def test_shutdown_wakes_every_waiter() -> None:
    n = Notifier(dsn="postgresql://unused@127.0.0.1:1/none")
    with n.waiter(uuid.uuid4()) as a, n.waiter(uuid.uuid4()) as b:
        waits = asyncio.gather(a.wait(10), b.wait(10))
        await asyncio.sleep(0)
        n.begin_shutdown()
        assert await asyncio.wait_for(waits, 1) == [True, True]
        with n.waiter(uuid.uuid4()) as late:  # a wait that starts during shutdown ends at once
            assert late.woken
