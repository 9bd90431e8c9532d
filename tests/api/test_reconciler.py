"""The reconciler inside the API process (``respool serve``) and ``respool reconcile --once``."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest
from typer.testing import CliRunner

from app.db.connect import APP_RECONCILER, connect
from app.reconciler import Reconciler
from cli.main import app as cli_app
from support.http import ok, pool_with_policy
from support.server import running_server


async def test_reclaim_is_woken_by_the_new_request_not_the_interval(db_url: str) -> None:
    # A 60 s interval: only the notification sent with the queued request can explain a
    # reclaim that answers a 20 s long-poll.
    async with running_server(db_url, with_reconciler=True, reconcile_interval=60.0) as srv:
        # Its first full pass runs at start; the next one is 60 s away.
        reconciler = srv.app.state.reconciler
        for _ in range(200):  # bounded: up to 10 s
            if reconciler.sweeps > 0:
                break
            await asyncio.sleep(0.05)
        assert reconciler.sweeps == 1
        await pool_with_policy(srv.client, capacity={"gpu": 4}, subject="dev")
        ok(
            await srv.client.post(
                "/v1/policies", json={"subject": "prod", "pool": "p", "reserved": {"gpu": 2}}
            ),
            201,
        )
        borrower = ok(
            await srv.client.post("/v1/requests", json={"subject": "dev", "resources": {"gpu": 4}}),
            201,
        )
        assert borrower["status"] == "allocated"

        prod = ok(
            await srv.client.post(
                "/v1/requests?wait=20", json={"subject": "prod", "resources": {"gpu": 2}}
            ),
            201,
        )
        assert prod["status"] == "allocated"
        assert reconciler.sweeps == 1  # no full pass since: the notification did it
        victim = ok(await srv.client.get(f"/v1/requests/{borrower['id']}"))
        assert (victim["status"], victim["reason"]) == ("preempted", "reclaim")
        conn = await asyncpg.connect(db_url)
        try:
            names = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = $1 AND datname = current_database()",
                APP_RECONCILER,
            )
        finally:
            await conn.close()
        assert names == 1  # one connection for LISTEN and passes


async def test_reconcile_once_prints_what_it_did(db_url: str) -> None:
    async with running_server(db_url) as srv:  # no reconciler in the server
        await pool_with_policy(srv.client, capacity={"gpu": 2}, subject="dev")
        ok(
            await srv.client.post(
                "/v1/policies", json={"subject": "prod", "pool": "p", "reserved": {"gpu": 2}}
            ),
            201,
        )
        await srv.client.post("/v1/requests", json={"subject": "dev", "resources": {"gpu": 2}})
        prod = ok(
            await srv.client.post(
                "/v1/requests", json={"subject": "prod", "resources": {"gpu": 1}}
            ),
            201,
        )
        assert prod["status"] == "queued"
        result = await asyncio.to_thread(
            CliRunner().invoke,
            cli_app,
            ["reconcile", "--once"],
            env={"RESPOOL_DATABASE_URL": db_url},
        )
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert lines[0].split() == [
            "pool",
            "expired",
            "grace_ended",
            "preempted",
            "allocated",
            "rejected",
        ]
        assert lines[1].split() == ["p", "0", "0", "1", "1", "0"]
        assert ok(await srv.client.get(f"/v1/requests/{prod['id']}"))["status"] == "allocated"


async def test_standalone_reconciler_logs_its_state_changes(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``respool reconcile`` has no API listener: it logs the changes it makes itself."""
    conn = await connect(db_url, application_name="respool-test")
    reconciler = Reconciler(db_url, interval=0.05, log_changes=True)
    loop = asyncio.create_task(reconciler.run())
    try:
        await conn.execute("SELECT respool.create_pool('p', '{\"gpu\": 2}')")
        await conn.execute("SELECT respool.create_policy('dev', 'p')")
        await conn.execute(
            "SELECT respool.create_policy('prod', 'p', p_reserved => '{\"gpu\": 2}')"
        )
        await conn.execute(
            "SELECT respool.create_request("
            '\'{"subject": "dev", "pool": "p", "resources": {"gpu": 2}}\')'
        )
        with caplog.at_level(logging.INFO, logger="respool.state"):
            await conn.execute(
                "SELECT respool.create_request("
                '\'{"subject": "prod", "pool": "p", "resources": {"gpu": 2}}\')'
            )
            for _ in range(200):  # bounded: up to 10 s
                if any("-> preempted" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.05)
        lines = [r.getMessage() for r in caplog.records if r.name == "respool.state"]
        assert any(
            "allocated -> preempted (subject dev, pool p, reason reclaim)" in m for m in lines
        ), lines
        assert any("queued -> allocated (subject prod, pool p)" in m for m in lines), lines
    finally:
        reconciler.stop()
        await asyncio.wait_for(loop, 10)
        await conn.close()
