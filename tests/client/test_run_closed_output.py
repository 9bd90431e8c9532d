"""``respool run`` whose own output goes nowhere (``respool run … -- CMD | head -1``, a closed
terminal): a closed stdout or stderr never stops CMD nor the release (docs/client.md,
"respool run": its messages are best effort). Real wrapper processes against a real server."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from support.http import ok
from support.server import Server, running_server
from tests.client.test_run import _until


@pytest.fixture
async def live(db_url: str) -> Any:
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as srv:
        yield srv


async def _full_pool(server: Server) -> str:
    """Pool p of 1 GPU, held by ``blocker``; the blocker's request id."""
    ok(await server.client.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
    for subject in ("blocker", "borrower"):
        body = {"subject": subject, "pool": "p", "reserved": {"gpu": 0}}
        ok(await server.client.post("/v1/policies", json=body), 201)
    body = {"subject": "blocker", "resources": {"gpu": 1}}
    held = ok(await server.client.post("/v1/requests", json=body), 201)
    assert held["status"] == "allocated"
    return str(held["id"])


async def _borrower_request(server: Server) -> dict[str, Any] | None:
    items = ok(await server.client.get("/v1/requests", params={"subject": "borrower"}))["items"]
    return items[0] if items else None


@pytest.mark.parametrize("reader", ["gone", "head -1"])
@pytest.mark.parametrize("streams", ["stdout", "stdout+stderr"])
async def test_closed_output_pipe_neither_stops_cmd_nor_the_release(
    live: Server, tmp_path: Path, streams: str, reader: str
) -> None:
    """``respool run … -- CMD 2>&1 | head -1`` on a full pool: the reader of the wrapper's
    output is gone (from the start, or after the first line) when the grant comes."""
    blocker = await _full_pool(live)
    ran = tmp_path / "ran"
    env = {**os.environ, "RESPOOL_URL": live.url, "RESPOOL_SUBJECT": "borrower"}
    env.pop("RESPOOL_TOKEN", None)
    read_end, write_end = os.pipe()
    if reader == "gone":
        os.close(read_end)
    err_file = (tmp_path / "wrapper.err").open("wb")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "respool_client.run", "--gpu", "1",
            "--", sys.executable, "-c", f"open({str(ran)!r}, 'w').write('ran')",
            env=env, stdout=write_end,
            stderr=write_end if "stderr" in streams else err_file,
        )  # fmt: skip
    finally:
        os.close(write_end)
        err_file.close()
    queued = await _until(lambda: _borrower_request(live))
    assert queued["status"] == "queued"
    if reader == "head -1":
        if "stderr" in streams:  # the queued line came through, then the reader left
            with os.fdopen(read_end, "rb") as pipe:
                assert b"in queue" in await asyncio.to_thread(pipe.readline)
        else:
            os.close(read_end)
    ok(await live.client.post(f"/v1/requests/{blocker}/release"))  # the grant comes now
    code = await asyncio.wait_for(proc.wait(), 30)
    assert ran.read_text() == "ran"  # CMD ran
    after = ok(await live.client.get(f"/v1/requests/{queued['id']}"))
    assert after["status"] == "released"  # and the units were given back at once
    assert code == 0, (tmp_path / "wrapper.err").read_text()


async def test_cmd_writing_to_the_closed_pipe_ends_as_in_any_pipeline(
    live: Server, tmp_path: Path
) -> None:
    """``respool run -- yes | head -1``: CMD gets the closed pipe's SIGPIPE like in any
    pipeline (it is not kept writing into nothing), and the units are released."""
    ok(await live.client.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
    body = {"subject": "borrower", "pool": "p", "reserved": {"gpu": 1}}
    ok(await live.client.post("/v1/policies", json=body), 201)
    env = {**os.environ, "RESPOOL_URL": live.url, "RESPOOL_SUBJECT": "borrower"}
    env.pop("RESPOOL_TOKEN", None)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "respool_client.run", "--gpu", "1", "--", "yes",
            env=env, stdout=write_end, stderr=write_end,
        )  # fmt: skip
    finally:
        os.close(write_end)
    code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 128 + 13  # SIGPIPE ended CMD; its status is the wrapper's
    request = await _borrower_request(live)
    assert request is not None and request["status"] == "released"
