"""Shrinks through the API and ``respool reconcile --once`` (docs/preemption.md): removing a
custom key preempts its holders, and a limit lowered on two keys preempts only the victims
needed."""

from __future__ import annotations

import asyncio
from typing import Any

from typer.testing import CliRunner

from cli.main import app as cli_app
from support.http import ok
from support.server import running_server


async def _reconcile_once(db_url: str) -> dict[str, list[str]]:
    """`respool reconcile --once`: its table as {pool: [expired, grace_ended, preempted, ...]}."""
    result = await asyncio.to_thread(
        CliRunner().invoke, cli_app, ["reconcile", "--once"], env={"RESPOOL_DATABASE_URL": db_url}
    )
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[0][:4] == ["pool", "expired", "grace_ended", "preempted"]
    return {row[0]: row[1:] for row in lines[1:] if row}


async def test_removing_a_custom_key_preempts_its_holder(db_url: str) -> None:
    async with running_server(db_url) as srv:  # no reconciler in the server
        c = srv.client
        ok(await c.post("/v1/pools", json={"name": "a", "capacity": {"gpu": 2, "lic": 1}}), 201)
        ok(await c.post("/v1/policies", json={"subject": "s", "pool": "a"}), 201)
        r: dict[str, Any] = ok(
            await c.post("/v1/requests", json={"subject": "s", "resources": {"lic": 1}}), 201
        )
        assert r["status"] == "allocated"
        pool = ok(await c.patch("/v1/pools/a", json={"capacity": {"lic": 0}}))
        assert "lic" not in pool["capacity"]
        assert (await _reconcile_once(db_url))["a"][2] == "1"  # preempted
        got = ok(await c.get(f"/v1/requests/{r['id']}"))
        assert (got["status"], got["reason"]) == ("preempted", "capacity_shrink")
        assert ok(await c.get("/v1/pools/a"))["usage"].get("lic", 0) == 0


async def test_limit_lowered_on_two_keys_preempts_only_the_newest(db_url: str) -> None:
    async with running_server(db_url) as srv:
        c = srv.client
        ok(await c.post("/v1/pools", json={"name": "d", "capacity": {"gpu": 6}}), 201)
        policy = ok(
            await c.post(
                "/v1/policies",
                json={"subject": "s", "pool": "d", "limit": {"gpu": 5, "step_run": 5}},
            ),
            201,
        )
        x = ok(await c.post("/v1/requests", json={"subject": "s", "resources": {"gpu": 2}}), 201)
        y = ok(await c.post("/v1/requests", json={"subject": "s", "resources": {"gpu": 1}}), 201)
        assert [x["status"], y["status"]] == ["allocated", "allocated"]
        ok(await c.patch(f"/v1/policies/{policy['id']}", json={"limit": {"gpu": 2, "step_run": 1}}))
        assert (await _reconcile_once(db_url))["d"][2] == "1"
        states = [ok(await c.get(f"/v1/requests/{i}"))["status"] for i in (x["id"], y["id"])]
        assert states == ["allocated", "preempted"]
