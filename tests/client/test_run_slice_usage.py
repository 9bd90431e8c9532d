"""``respool run`` measures its command's GPU memory and reports it with its heartbeats
(docs/placement.md, "Sharing a GPU", "On the step side"): a fake ``nvidia-smi`` on PATH lists
the compute processes the command writes into it (a process of its group, and one that is
not its own), the server compares the sum over the command's group with the request's
``gpu_memory_mb``. Over the slice in a pool that terminates overuse, the command is stopped and
the wrapper exits as preempted; within it, nothing happens."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.http import ok
from support.nvidia import apps_file, fake_a100_box
from support.server import Server, running_server
from support.wait import first_true

EXIT_PREEMPTED = 75

# The command: starts a child in its own group (what a training script's workers are), writes
# that child as a compute process using MIB MiB, and a process that is not its own (the test's)
# using far more; records the SIGTERM it gets; exits after DONE seconds of nothing (never
# reached when it is stopped).
CHILD = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    log, apps, mib, stranger = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    worker = subprocess.Popen(["sleep", "60"])
    with open(apps, "a") as f:
        f.write(f"{worker.pid}, {mib}\\n{stranger}, 70000\\n")
    def record(event):
        with open(log, "a") as f:
            f.write(json.dumps({"event": event}) + "\\n")
    def on_term(signum, frame):
        record("sigterm")
        worker.kill()
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    record("start")
    while not os.path.exists(log + ".done"):
        time.sleep(0.05)
    worker.kill()
    """
)


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Server]:
    async with running_server(
        db_url, with_reconciler=True, reconcile_interval=0.2, metrics_cache_seconds=0.0
    ) as srv:
        yield srv


async def _pool(server: Server, overuse: str) -> None:
    body = {"name": "nb", "capacity": {"gpu_memory_mb": 81920}, "slice_overuse": overuse}
    ok(await server.client.post("/v1/pools", json=body), 201)
    ok(await server.client.post("/v1/policies", json={"subject": "team", "pool": "nb"}), 201)


async def _wrap(server: Server, tmp: Path, mib: int) -> asyncio.subprocess.Process:
    """``respool run --gpu-memory 20GiB --lease 3 -- python CHILD`` with the fake nvidia-smi."""
    bin_dir = tmp / "bin"
    fake_a100_box(bin_dir)
    child = tmp / "child.py"
    child.write_text(CHILD)
    environ = {
        **os.environ,
        "RESPOOL_URL": server.url,
        "RESPOOL_SUBJECT": "team",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    environ.pop("RESPOOL_TOKEN", None)
    args = [str(child), str(tmp / "log"), str(apps_file(bin_dir)), str(mib), str(os.getpid())]
    with (tmp / "wrapper.err").open("wb") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "respool_client.run", "--pool", "nb", "--gpu-memory", "20GiB",
            "--lease", "3", "--", sys.executable, *args,
            env=environ, stdout=asyncio.subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


def _events(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [json.loads(line)["event"] for line in log.read_text().splitlines() if line.strip()]


async def _only_request(server: Server) -> dict[str, Any]:
    items = ok(await server.client.get("/v1/requests", params={"pool": "nb"}))["items"]
    assert len(items) == 1
    found: dict[str, Any] = items[0]
    return found


async def _reported(server: Server) -> float | None:
    """respool_slice_over_holders of nb's gpu_memory_mb: a series once the holder reported."""
    text = (await server.client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "respool_slice_over_holders" and sample.labels.get("pool") == "nb":
                return float(sample.value)
    return None


async def test_over_its_slice_in_a_terminating_pool_the_command_is_stopped(
    live: Server, tmp_path: Path
) -> None:
    await _pool(live, "terminate")
    proc = await _wrap(live, tmp_path, mib=30000)  # above 20 GiB = 20480 MiB
    code = await asyncio.wait_for(proc.wait(), 30)
    err = (tmp_path / "wrapper.err").read_text()
    assert code == EXIT_PREEMPTED, err
    assert _events(tmp_path / "log") == ["start", "sigterm"]
    req = await _only_request(live)
    assert (req["status"], req["reason"], req["attempt"]) == ("preempted", "over_slice", 1)
    assert req["resources"]["gpu_memory_mb"] == 20480
    events = ok(await live.client.get(f"/v1/requests/{req['id']}/events"))
    (note,) = [e for e in events if e["reason"] == "over_slice" and e["to"] == "allocated"]
    # the worker of its group counts; the process that is not its own does not
    assert "30000 MiB used" in note["message"], note


async def test_within_its_slice_the_command_runs_to_its_end(live: Server, tmp_path: Path) -> None:
    await _pool(live, "terminate")
    proc = await _wrap(live, tmp_path, mib=1000)

    async def reported() -> bool:
        return await _reported(live) is not None

    await first_true(reported)  # a heartbeat carried the use
    assert await _reported(live) == 0  # within its slice
    (tmp_path / "log.done").touch()
    code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0, (tmp_path / "wrapper.err").read_text()
    req = await _only_request(live)
    assert (req["status"], req["reason"]) == ("released", None)
    events = ok(await live.client.get(f"/v1/requests/{req['id']}/events"))
    assert not [e for e in events if e["reason"] == "over_slice"]
