"""The reconciler inside the API process (``respool serve``) and ``respool reconcile --once``."""

from __future__ import annotations

import asyncio

import asyncpg
from typer.testing import CliRunner

from app.db.connect import APP_RECONCILER
from cli.main import app as cli_app
from tests.api.conftest import running_server
from tests.api.helpers import ok, pool_with_policy


async def test_reclaim_is_woken_by_the_new_request_not_the_interval(db_url: str) -> None:
    # A 60 s interval: only the notification sent with the queued request can explain a
    # reclaim that answers a 20 s long-poll.
    async with running_server(db_url, with_reconciler=True, reconcile_interval=60.0) as srv:
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
        await asyncio.sleep(0.2)  # the reconciler's first full pass is behind us
        prod = ok(
            await srv.client.post(
                "/v1/requests?wait=20", json={"subject": "prod", "resources": {"gpu": 2}}
            ),
            201,
        )
        assert prod["status"] == "allocated"
        victim = ok(await srv.client.get(f"/v1/requests/{borrower['id']}"))
        assert (victim["status"], victim["reason"]) == ("preempted", "reclaim")
        conn = await asyncpg.connect(db_url)
        try:
            names = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", APP_RECONCILER
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
