"""``respool run`` (``docs/client.md``) with real processes against a real server with its
reconciler: the wrapper (``python -m respool_client.run``) runs a child that records, in a file,
each start (with its RESPOOL_* environment) and each SIGTERM it gets; the group tests run a CMD
that leaves a ``sleep`` in its process group."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from support.http import ok
from support.server import Server, running_server
from support.wait import first_true

EXIT_REJECTED = 73
EXIT_PREEMPTED = 75

# The child: "start" with its environment; then, per MODE, on SIGTERM record it and exit 0
# ("polite"), or record it and keep running ("stubborn"); MODE "retry" behaves politely on
# attempt 1 and exits 7 at once on attempt 2.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    log, mode = sys.argv[1], sys.argv[2]
    def record(event, **more):
        with open(log, "a") as f:
            line = {"event": event, "at": time.time(), "pid": os.getpid(), **more}
            f.write(json.dumps(line) + "\\n")
    attempt = int(os.environ["RESPOOL_ATTEMPT"])
    record("start", attempt=attempt, request=os.environ["RESPOOL_REQUEST_ID"],
           pool=os.environ["RESPOOL_POOL"], resources=json.loads(os.environ["RESPOOL_RESOURCES"]),
           node=os.environ.get("RESPOOL_NODE"), devices=os.environ.get("RESPOOL_DEVICES"),
           cuda=os.environ.get("CUDA_VISIBLE_DEVICES"))
    if mode == "retry" and attempt == 2:
        sys.exit(7)
    def on_term(signum, frame):
        record("sigterm", attempt=attempt)
        if mode != "stubborn":
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    while True:
        time.sleep(0.05)
    """
)


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Server]:
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as srv:
        yield srv


def _events(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


async def _setup(server: Server, *, grace: int, gpus: int = 2) -> None:
    """Pool p: ``gpus`` GPUs; owner reserves them all, borrower has no share (borrows)."""
    pool = {"name": "p", "capacity": {"gpu": gpus}, "preemption_grace_seconds": grace}
    ok(await server.client.post("/v1/pools", json=pool), 201)
    for subject, reserved in (("owner", gpus), ("borrower", 0)):
        body = {"subject": subject, "pool": "p", "reserved": {"gpu": reserved}}
        ok(await server.client.post("/v1/policies", json=body), 201)


async def _run_wrapped(
    server: Server, tmp: Path, script: Sequence[str], options: Sequence[str], **env: str
) -> asyncio.subprocess.Process:
    """``respool run [options] -- python SCRIPT ARGS...`` (``script``) as subject borrower
    against ``server``, with ``env`` set; its stderr goes to ``tmp/wrapper.err``."""
    environ = {**os.environ, "RESPOOL_URL": server.url, "RESPOOL_SUBJECT": "borrower"}
    environ.pop("RESPOOL_TOKEN", None)
    environ.update(env)
    # Output to a file, not a pipe: an orphaned CMD (the wrapper killed) would hold a pipe open.
    with (tmp / "wrapper.err").open("wb") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "respool_client.run", *options, "--", sys.executable, *script,
            env=environ, stdout=asyncio.subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


async def _wrap(
    server: Server, tmp: Path, mode: str, *options: str, env_extra: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    os.makedirs(tmp, exist_ok=True)
    child = tmp / "child.py"
    child.write_text(CHILD)
    script = (str(child), str(tmp / "log"), mode)
    return await _run_wrapped(server, tmp, script, options, **(env_extra or {}))


async def _exit(proc: asyncio.subprocess.Process, tmp: Path) -> tuple[int, str]:
    """The wrapper's exit status and what it wrote on stderr."""
    code = await asyncio.wait_for(proc.wait(), 30)
    return code, (tmp / "wrapper.err").read_text()


async def _request(server: Server, request_id: str) -> dict[str, Any]:
    body: dict[str, Any] = ok(await server.client.get(f"/v1/requests/{request_id}"))
    return body


async def _owner_takes_back(server: Server) -> dict[str, Any]:
    body = {"subject": "owner", "resources": {"gpu": 2}}
    owner: dict[str, Any] = ok(await server.client.post("/v1/requests", json=body), 201)
    return owner


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_preempting_sends_sigterm_before_the_deadline(live: Server, tmp_path: Path) -> None:
    await _setup(live, grace=20)
    proc = await _wrap(live, tmp_path, "polite", "--gpu", "2")
    log = tmp_path / "log"
    started = await first_true(lambda: _first(log, "start"))
    assert started["attempt"] == 1 and started["pool"] == "p"
    assert started["resources"]["gpu"] == 2
    owner = await _owner_takes_back(live)
    term = await first_true(lambda: _first(log, "sigterm"))
    # The deadline is the preempting event's time plus the grace (the request's own
    # preempt_deadline is cleared once the wrapper releases, which may already have happened).
    events = ok(await live.client.get(f"/v1/requests/{started['request']}/events"))
    preempting = next(e for e in events if e["to"] == "preempting")
    deadline = datetime.fromisoformat(preempting["at"]).timestamp() + 20
    assert term["at"] < deadline  # the step heard it while its grace was still running
    code, err = await _exit(proc, tmp_path)
    assert code == EXIT_PREEMPTED, err
    # The child stopped; the wrapper released: the owner gets the units at once.
    assert await first_true(lambda: _status_is(live, owner["id"], "allocated"))
    assert (await _request(live, started["request"]))["status"] == "preempted"


@pytest.mark.slow  # waits out the grace deadline
async def test_sigkill_at_the_deadline_when_sigterm_is_ignored(
    live: Server, tmp_path: Path
) -> None:
    await _setup(live, grace=2)
    proc = await _wrap(live, tmp_path, "stubborn", "--gpu", "2")
    log = tmp_path / "log"
    started = await first_true(lambda: _first(log, "start"))
    owner = await _owner_takes_back(live)
    await first_true(lambda: _first(log, "sigterm"))
    code, err = await _exit(proc, tmp_path)
    assert code == EXIT_PREEMPTED, err
    assert "SIGKILL" in err
    assert not _alive(started["pid"])
    assert await first_true(lambda: _status_is(live, owner["id"], "allocated"))


async def test_requeued_after_preemption_runs_again(live: Server, tmp_path: Path) -> None:
    await _setup(live, grace=20)
    proc = await _wrap(live, tmp_path, "retry", "--gpu", "2", "--max-retries", "1")
    log = tmp_path / "log"
    first = await first_true(lambda: _first(log, "start"))
    owner = await _owner_takes_back(live)
    await first_true(lambda: _first(log, "sigterm"))
    await first_true(lambda: _status_is(live, owner["id"], "allocated"))
    ok(await live.client.post(f"/v1/requests/{owner['id']}/release"))
    code, err = await _exit(proc, tmp_path)
    assert code == 7, err  # the second run's own status
    starts = [e for e in _events(log) if e["event"] == "start"]
    assert [s["attempt"] for s in starts] == [1, 2]
    assert {s["request"] for s in starts} == {first["request"]}
    assert (await _request(live, first["request"]))["status"] == "released"


@pytest.mark.slow  # waits out a lease
async def test_kill_9_of_the_wrapper_lease_expiry_frees_the_units(
    live: Server, tmp_path: Path
) -> None:
    await _setup(live, grace=0)
    proc = await _wrap(live, tmp_path, "polite", "--gpu", "2", "--lease", "2")
    log = tmp_path / "log"
    started = await first_true(lambda: _first(log, "start"))
    proc.kill()
    await proc.wait()
    try:
        assert await first_true(lambda: _status_is(live, started["request"], "expired"), 30)
        pool = ok(await live.client.get("/v1/pools/p"))
        assert not pool["usage"].get("gpu")
    finally:
        if _alive(started["pid"]):  # the orphaned child, in its own process group
            os.killpg(started["pid"], signal.SIGKILL)


async def test_sigterm_to_the_wrapper_stops_cmd_and_releases(live: Server, tmp_path: Path) -> None:
    await _setup(live, grace=0)
    proc = await _wrap(live, tmp_path, "polite", "--gpu", "1")
    log = tmp_path / "log"
    started = await first_true(lambda: _first(log, "start"))
    proc.send_signal(signal.SIGTERM)
    await first_true(lambda: _first(log, "sigterm"))
    code, err = await _exit(proc, tmp_path)
    assert code == 128 + signal.SIGTERM, err
    assert (await _request(live, started["request"]))["status"] == "released"


async def test_rejection_exits_at_once_with_the_reason(live: Server, tmp_path: Path) -> None:
    await _setup(live, grace=0)
    proc = await _wrap(live, tmp_path, "polite", "--gpu", "9")
    code, err = await _exit(proc, tmp_path)
    assert code == EXIT_REJECTED, err
    assert "exceeds_capacity" in err
    assert not (tmp_path / "log").exists()  # CMD never ran


async def _first(log: Path, event: str) -> dict[str, Any] | None:
    return next((e for e in _events(log) if e["event"] == event), None)


async def _status_is(server: Server, request_id: str, status: str) -> bool:
    return bool((await _request(server, request_id))["status"] == status)


# --- CMD's whole process group never outlives the grant, nor the wrapper ----------------------

# CMD for the group tests: records "CMD_PID BACKGROUND_PID" in a file, then per MODE exits at
# once leaving a `sleep` behind ("leave"), or waits for it ("wait"), ignoring SIGTERM and
# SIGINT itself with "stubborn".
GROUP_CMD = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    pids, mode = sys.argv[1], sys.argv[2]
    bg = subprocess.Popen(["sleep", "60"])
    with open(pids + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {bg.pid}")
    os.rename(pids + ".tmp", pids)
    if mode == "leave":
        sys.exit(0)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        time.sleep(0.05)
    """
)


async def _wrap_group(
    server: Server, tmp: Path, mode: str, *options: str
) -> asyncio.subprocess.Process:
    cmd = tmp / "cmd.py"
    cmd.write_text(GROUP_CMD)
    return await _run_wrapped(server, tmp, (str(cmd), str(tmp / "pids"), mode), options)


async def _pids(tmp: Path) -> tuple[int, int] | None:
    path = tmp / "pids"
    if not path.exists():
        return None
    cmd_pid, bg_pid = path.read_text().split()
    return int(cmd_pid), int(bg_pid)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's reaper may be slow or absent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _the_request(server: Server) -> dict[str, Any]:
    items = ok(await server.client.get("/v1/requests", params={"subject": "borrower"}))["items"]
    assert len(items) == 1, items
    body: dict[str, Any] = items[0]
    return body


async def _watch_release(
    server: Server, proc: asyncio.subprocess.Process, pids: tuple[int, ...]
) -> bool:
    """Poll until the wrapper exits; whenever the request reads ``released``, no process of
    CMD's group may be running (read the status first: a release must follow their end)."""
    seen_released = False
    while proc.returncode is None:
        status = (await _the_request(server))["status"]
        if status != "allocated":
            running = [pid for pid in pids if _running(pid)]
            assert not running, f"request {status} while CMD's group still runs: {running}"
            seen_released = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.02)
    return seen_released


def _kill_leftovers(pids: tuple[int, int] | None) -> None:
    for pid in pids or ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


async def test_cmd_leaving_children_they_are_stopped_before_the_release(
    live: Server, tmp_path: Path
) -> None:
    await _setup(live, grace=0)
    proc = await _wrap_group(live, tmp_path, "leave", "--gpu", "1")
    pids = await first_true(lambda: _pids(tmp_path))
    try:
        await _watch_release(live, proc, pids)
        code, err = await _exit(proc, tmp_path)
        assert code == 0, err
        assert not _running(pids[1])
        assert (await _the_request(live))["status"] == "released"
    finally:
        _kill_leftovers(pids)


async def test_sigterm_cmd_ignoring_it_keeps_the_units_until_it_is_killed(
    live: Server, tmp_path: Path
) -> None:
    await _setup(live, grace=0)
    proc = await _wrap_group(live, tmp_path, "stubborn", "--gpu", "1", "--kill-after", "1")
    pids = await first_true(lambda: _pids(tmp_path))
    try:
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        await _watch_release(live, proc, pids)
        code, err = await _exit(proc, tmp_path)
        assert code == 128 + signal.SIGTERM, err
        assert time.monotonic() - sent >= 1  # the stubborn CMD got its --kill-after
        assert "SIGKILL" in err
        assert not any(_running(pid) for pid in pids)
        assert (await _the_request(live))["status"] == "released"
    finally:
        _kill_leftovers(pids)


@pytest.mark.parametrize(
    "sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM]
)
async def test_every_stop_signal_stops_the_group_then_releases(
    live: Server, tmp_path: Path, sig: signal.Signals
) -> None:
    await _setup(live, grace=0)
    proc = await _wrap_group(live, tmp_path, "wait", "--gpu", "1")
    pids = await first_true(lambda: _pids(tmp_path))
    try:
        proc.send_signal(sig)
        await _watch_release(live, proc, pids)
        code, err = await _exit(proc, tmp_path)
        assert code == 128 + sig, err
        assert not any(_running(pid) for pid in pids)
        assert (await _the_request(live))["status"] == "released"
    finally:
        _kill_leftovers(pids)


async def test_sigkill_of_the_wrapper_kills_cmds_whole_group(live: Server, tmp_path: Path) -> None:
    await _setup(live, grace=0)
    proc = await _wrap_group(live, tmp_path, "wait", "--gpu", "1")
    pids = await first_true(lambda: _pids(tmp_path))
    try:
        proc.kill()
        await proc.wait()

        async def all_gone() -> bool:
            return not any(_running(pid) for pid in pids)

        await first_true(all_gone, within=5)
    finally:
        _kill_leftovers(pids)


async def test_wrapper_killed_while_queued_loses_its_place(live: Server, tmp_path: Path) -> None:
    await _setup(live, grace=0)
    holder = {"subject": "owner", "resources": {"gpu": 2}, "lease_seconds": None}
    ok(await live.client.post("/v1/requests", json=holder), 201)
    proc = await _wrap_group(live, tmp_path, "wait", "--gpu", "1", "--queue-lease", "2")

    async def queued() -> bool:
        items = ok(await live.client.get("/v1/requests", params={"subject": "borrower"}))["items"]
        return bool(items and items[0]["status"] == "queued")

    await first_true(queued)
    await asyncio.sleep(3)  # longer than the queue lease: the wrapper's heartbeats keep it
    assert (await _the_request(live))["status"] == "queued"
    proc.kill()
    await proc.wait()

    async def abandoned() -> bool:
        body = await _the_request(live)
        return bool((body["status"], body["reason"]) == ("cancelled", "abandoned"))

    await first_true(abandoned, within=8)
    assert not (tmp_path / "pids").exists()  # CMD never ran


async def test_lease_none_asks_for_no_lease(live: Server, tmp_path: Path) -> None:
    await _setup(live, grace=0)
    proc = await _wrap_group(live, tmp_path, "wait", "--gpu", "1", "--lease", "none")
    pids = await first_true(lambda: _pids(tmp_path))
    try:
        body = await _the_request(live)
        assert body["lease_seconds"] is None and body["lease_expires_at"] is None
        proc.send_signal(signal.SIGTERM)
        code, err = await _exit(proc, tmp_path)
        assert code == 128 + signal.SIGTERM, err
    finally:
        _kill_leftovers(pids)


async def test_api_unreachable_past_the_lease_stops_cmd(db_url: str, tmp_path: Path) -> None:
    async with running_server(db_url) as server:
        await _setup(server, grace=0)
        proc = await _wrap(server, tmp_path, "polite", "--gpu", "1", "--lease", "3")
        log = tmp_path / "log"
        started = await first_true(lambda: _first(log, "start"))
    gone_at = time.time()  # the API is gone: no heartbeat gets through any more
    try:
        term = await first_true(lambda: _first(log, "sigterm"), within=10)
        assert term["at"] - gone_at < 3 + 1.5  # by the end of the lease (plus a heartbeat)
        await first_true(lambda: _not_running(started["pid"]), within=5)
        assert "no heartbeat got through within the lease" in (tmp_path / "wrapper.err").read_text()
    finally:
        proc.kill()
        await proc.wait()


async def _not_running(pid: int) -> bool:
    return not _running(pid)


async def test_a_second_signal_kills_at_once(live: Server, tmp_path: Path) -> None:
    await _setup(live, grace=0)
    proc = await _wrap_group(live, tmp_path, "stubborn", "--gpu", "1", "--kill-after", "30")
    pids = await first_true(lambda: _pids(tmp_path))
    try:
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)
        assert _running(pids[0])  # the stubborn CMD ignores the first one (passed on as SIGINT)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code, err = await _exit(proc, tmp_path)
        assert code == 128 + signal.SIGINT, err
        assert time.monotonic() - sent < 5  # not the 30 s of --kill-after
        assert not any(_running(pid) for pid in pids)
        assert (await _the_request(live))["status"] == "released"
    finally:
        _kill_leftovers(pids)


# --- pools backed by nodes: the wrapper sets RESPOOL_NODE, RESPOOL_DEVICES, CUDA_VISIBLE_DEVICES --

EIGHT = [str(i) for i in range(8)]


async def _add_node(server: Server, **body: Any) -> None:
    """Register a node (``POST /v1/nodes``)."""
    ok(await server.client.post("/v1/nodes", json=body), 201)


async def _node_pool(
    server: Server, *machines: tuple[str, list[str]], owner: int = 0, grace: int = 0
) -> None:
    """Pool p backed by ``machines`` (name, gpu device ids); borrower has no reserved share,
    owner reserves ``owner`` GPUs."""
    pool = {"name": "p", "capacity": {}, "preemption_grace_seconds": grace}
    ok(await server.client.post("/v1/pools", json=pool), 201)
    for name, gpus in machines:
        await _add_node(server, name=name, pool="p", labels={"gpu-type": "A100-80G"},
                        capacity={"gpu": len(gpus)}, devices={"gpu": gpus})  # fmt: skip
    for subject, reserved in (("borrower", 0), ("owner", owner)):
        body = {"subject": subject, "pool": "p", "reserved": {"gpu": reserved}}
        ok(await server.client.post("/v1/policies", json=body), 201)


async def _queued_in_p(server: Server) -> list[dict[str, Any]]:
    page = ok(await server.client.get("/v1/requests", params={"pool": "p", "status": "queued"}))
    items: list[dict[str, Any]] = page["items"]
    return items


async def test_two_runs_on_one_8_gpu_node_see_disjoint_gpus(live: Server, tmp_path: Path) -> None:
    await _node_pool(live, ("box-1", EIGHT))
    # An inherited CUDA_VISIBLE_DEVICES is overwritten by the placed devices.
    inherited = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    a = await _wrap(live, tmp_path / "a", "polite", "--gpu", "4", env_extra=inherited)
    b = await _wrap(live, tmp_path / "b", "polite", "--gpu", "4", env_extra=inherited)
    started_a = await first_true(lambda: _first(tmp_path / "a" / "log", "start"))
    started_b = await first_true(lambda: _first(tmp_path / "b" / "log", "start"))
    gpus_a, gpus_b = started_a["cuda"].split(","), started_b["cuda"].split(",")
    assert len(gpus_a) == len(gpus_b) == 4
    assert set(gpus_a).isdisjoint(gpus_b)
    assert sorted(gpus_a + gpus_b, key=int) == EIGHT
    for started, gpus in ((started_a, gpus_a), (started_b, gpus_b)):
        assert started["node"] == "box-1"
        assert json.loads(started["devices"]) == {"gpu": gpus}
        placement = (await _request(live, started["request"]))["placement"]
        assert placement["node"] == "box-1" and placement["devices"] == {"gpu": gpus}

    # A third run of 4 GPUs waits: the node has none left.
    c = await _wrap(live, tmp_path / "c", "polite", "--gpu", "4")
    queued = await first_true(lambda: _queued_in_p(live))
    assert len(queued) == 1
    assert await _first(tmp_path / "c" / "log", "start") is None

    # One ends: the third runs, on the GPUs it left.
    a.send_signal(signal.SIGTERM)
    code, err = await _exit(a, tmp_path / "a")
    assert code == 128 + signal.SIGTERM, err
    started_c = await first_true(lambda: _first(tmp_path / "c" / "log", "start"))
    assert started_c["request"] == queued[0]["id"]
    assert set(started_c["cuda"].split(",")) == set(gpus_a)
    assert started_c["node"] == "box-1"
    for proc, tmp in ((b, tmp_path / "b"), (c, tmp_path / "c")):
        proc.send_signal(signal.SIGTERM)
        code, err = await _exit(proc, tmp)
        assert code == 128 + signal.SIGTERM, err


async def test_here_and_node_choose_the_node(live: Server, tmp_path: Path) -> None:
    await _node_pool(live, ("box-1", ["0", "1"]), ("box-2", ["GPU-aaaa", "MIG-bbbb"]))
    # --here: the node named by RESPOOL_NODE.
    proc = await _wrap(live, tmp_path / "here", "polite", "--gpu", "2", "--here",
                       env_extra={"RESPOOL_NODE": "box-2"})  # fmt: skip
    started = await first_true(lambda: _first(tmp_path / "here" / "log", "start"))
    assert started["node"] == "box-2"
    assert started["cuda"] == "GPU-aaaa,MIG-bbbb"  # UUIDs and MIG ids as given
    answer = await _request(live, started["request"])
    assert answer["node_selector"] == {"node": "box-2"}
    proc.send_signal(signal.SIGTERM)
    await _exit(proc, tmp_path / "here")
    # --node and --selector: both must match.
    proc = await _wrap(live, tmp_path / "node", "polite", "--gpu", "1", "--node", "box-1",
                       "--selector", "gpu-type=A100-80G")  # fmt: skip
    started = await first_true(lambda: _first(tmp_path / "node" / "log", "start"))
    assert started["node"] == "box-1" and started["cuda"] == "0"
    proc.send_signal(signal.SIGTERM)
    await _exit(proc, tmp_path / "node")
    # A selector that no node of the pool matches: rejected (no_fitting_node), CMD never runs.
    proc = await _wrap(live, tmp_path / "none", "polite", "--gpu", "1", "--selector",
                       "gpu-type=H100")  # fmt: skip
    code, err = await _exit(proc, tmp_path / "none")
    assert code == EXIT_REJECTED, err
    assert "no_fitting_node" in err
    assert not (tmp_path / "none" / "log").exists()


async def test_a_pool_without_nodes_leaves_cuda_visible_devices_alone(
    live: Server, tmp_path: Path
) -> None:
    await _setup(live, grace=0)
    proc = await _wrap(live, tmp_path, "polite", "--gpu", "1",
                       env_extra={"CUDA_VISIBLE_DEVICES": "3"})  # fmt: skip
    started = await first_true(lambda: _first(tmp_path / "log", "start"))
    assert started["cuda"] == "3"
    assert started["node"] is None and started["devices"] is None
    proc.send_signal(signal.SIGTERM)
    code, err = await _exit(proc, tmp_path)
    assert code == 128 + signal.SIGTERM, err


async def test_a_requeued_attempt_gets_the_env_of_its_new_placement(
    live: Server, tmp_path: Path
) -> None:
    await _node_pool(live, ("box-1", ["0", "1"]), ("box-2", ["GPU-b0", "GPU-b1"]), owner=2,
                     grace=20)  # fmt: skip
    proc = await _wrap(live, tmp_path, "retry", "--gpu", "2", "--max-retries", "1",
                       "--selector", "gpu-type=A100-80G")  # fmt: skip
    log = tmp_path / "log"
    first = await first_true(lambda: _first(log, "start"))
    taken = first["node"]
    other = "box-2" if taken == "box-1" else "box-1"
    # The owner takes its share back on exactly that node: the borrower is preempted there,
    # requeued, and its second attempt fits on the other node.
    body = {"subject": "owner", "resources": {"gpu": 2}, "node_selector": {"node": taken}}
    owner = ok(await live.client.post("/v1/requests", json=body), 201)
    code, err = await _exit(proc, tmp_path)
    assert code == 7, err  # the second run's own status
    starts = [e for e in _events(log) if e["event"] == "start"]
    assert [(s["attempt"], s["node"]) for s in starts] == [(1, taken), (2, other)]
    devices = {"box-1": "0,1", "box-2": "GPU-b0,GPU-b1"}
    assert [s["cuda"] for s in starts] == [devices[taken], devices[other]]
    assert json.loads(starts[1]["devices"]) == {"gpu": devices[other].split(",")}
    assert (await _request(live, owner["id"]))["placement"]["node"] == taken
