"""Anyone who can connect may NOTIFY on respool's channels (PostgreSQL has no
privilege for it). A flood of foreign payloads must cost the service one rate-limited warning and
bounded work: the API listener drops malformed payloads, the reconciler ignores ids of pools that
do not exist and caps how many notified pools one burst can queue."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import asyncpg
import pytest

from app import reconciler as reconciler_mod
from app.db import pools as db_pools
from app.db import reconcile as db_reconcile
from app.db.connect import APP_CLI, connect
from app.notify import CHANNEL, Notifier
from app.reconciler import POOL_CHANNEL, Reconciler
from support.wait import wait_until

FLOOD = 2000


async def test_listener_drops_malformed_payloads_with_one_warning(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier(db_url)
    await notifier.start()
    sender = await connect(db_url, application_name=APP_CLI)
    try:
        request_id = uuid.uuid4()
        with notifier.waiter(request_id) as w, caplog.at_level(logging.WARNING, "respool.notify"):
            await w.wait(0)  # the wake-all after connecting
            async with sender.transaction():
                for i in range(FLOOD):
                    await sender.execute("SELECT pg_notify($1, $2)", CHANNEL, f"bogus {i}")
            await sender.execute("SELECT pg_notify($1, $2)", CHANNEL, f'{{"id": "{request_id}"}}')
            assert await w.wait(10.0)  # a real wake-up still gets through
        warnings = [r for r in caplog.records if r.name == "respool.notify"]
        assert len(warnings) == 1, [r.getMessage() for r in warnings[:5]]
        assert "malformed" in warnings[0].getMessage()
    finally:
        await sender.close()
        await notifier.close()


async def test_reconciler_ignores_a_flood_of_foreign_pool_ids(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    admin = await connect(db_url, application_name=APP_CLI)
    pool = await db_pools.create_pool(admin, name="real", capacity={"gpu": 1})
    calls: list[uuid.UUID] = []
    original = db_reconcile.reconcile_pool

    async def counted(db: asyncpg.Connection, pool_id: uuid.UUID) -> Any:
        calls.append(pool_id)
        return await original(db, pool_id)

    monkeypatch.setattr(reconciler_mod.db_reconcile, "reconcile_pool", counted)
    rec = Reconciler(db_url, interval=3600.0)  # one full pass at start, then only notified ones
    task = asyncio.create_task(rec.run())
    try:
        await wait_until(lambda: rec.sweeps == 1 and calls == [pool.id], "the first sweep")
        with caplog.at_level(logging.WARNING, "respool.reconciler"):
            async with admin.transaction():
                for _ in range(FLOOD):
                    await admin.execute("SELECT pg_notify($1, $2)", POOL_CHANNEL, str(uuid.uuid4()))
                for i in range(50):
                    await admin.execute("SELECT pg_notify($1, $2)", POOL_CHANNEL, f"junk {i}")
            await admin.execute("SELECT pg_notify($1, $2)", POOL_CHANNEL, str(pool.id))
            await wait_until(lambda: calls.count(pool.id) >= 2, "the notified pass")
            await asyncio.sleep(0.3)  # anything still queued from the burst would run now
        # Only the real pool was passed over; no pass per foreign id.
        assert set(calls) == {pool.id}
        assert len(calls) <= 3
        warnings = [r for r in caplog.records if r.name == "respool.reconciler"]
        assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings[:5]]
    finally:
        rec.stop()
        await asyncio.wait_for(task, 10)
        await admin.close()
