"""What ``respool run`` tells its user while it waits (``docs/client.md``, "What it says"), and
its ``--help`` at 80 and 120 columns, with real processes: the installed ``respool`` console
script against a real server, its stderr read line by line (or, on a terminal, from a
pseudo-terminal) with a generous bounded wait for each line; the tests assert what the lines
say and in which order, never how fast they came."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import signal
import socket
import struct
import sys
import termios
import textwrap
import time
from collections.abc import AsyncIterator
from fcntl import ioctl
from pathlib import Path
from typing import Any

import pytest

from support.http import ok
from support.ports import free_port
from support.server import Server, respool_command, running_server

EXIT_API = 69
LINE_WITHIN = 25.0  # generous: a line that does not come within this is missing

# CMD: exits 0 on SIGTERM; with "once", exits 0 at once on its second attempt.
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    if sys.argv[1] == "once" and os.environ["RESPOOL_ATTEMPT"] != "1":
        sys.exit(0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.05)
    """
)
ETA = (
    r"; ETA (~\d+(\.\d)?[smh] \(90%: within \d+(\.\d)?[smh]\)"
    r"|unknown \(too few recorded holds, or too deep in the queue\))"
)


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Server]:
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as srv:
        yield srv


async def _setup(server: Server, *, grace: int = 20, holds: int = 1) -> None:
    """Pool p: 2 GPUs; owner reserves both, borrower has no share (borrows); ``holds`` past
    holds of the owner (an ETA needs ten)."""
    pool = {"name": "p", "capacity": {"gpu": 2}, "preemption_grace_seconds": grace}
    ok(await server.client.post("/v1/pools", json=pool), 201)
    for subject, reserved in (("owner", 2), ("borrower", 0)):
        body = {"subject": subject, "pool": "p", "reserved": {"gpu": reserved}}
        ok(await server.client.post("/v1/policies", json=body), 201)
    for _ in range(holds):
        past = await _owner_takes(server)
        ok(await server.client.post(f"/v1/requests/{past['id']}/release"))


async def _owner_takes(server: Server) -> dict[str, Any]:
    body = {"subject": "owner", "resources": {"gpu": 2}, "lease_seconds": None}
    request: dict[str, Any] = ok(await server.client.post("/v1/requests", json=body), 201)
    return request


def _env(url: str) -> dict[str, str]:
    env = {**os.environ, "RESPOOL_URL": url, "RESPOOL_SUBJECT": "borrower"}
    env.pop("RESPOOL_TOKEN", None)
    env.pop("RESPOOL_NODE", None)
    return env


def _argv(tmp: Path, mode: str, *options: str) -> list[str]:
    child = tmp / "child.py"
    child.write_text(CHILD)
    return [*respool_command(), "run", *options, "--", sys.executable, str(child), mode]


class Wrapper:
    """``respool run`` as a child process whose stderr is read line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    @classmethod
    async def start(cls, url: str, tmp: Path, mode: str, *options: str) -> Wrapper:
        proc = await asyncio.create_subprocess_exec(
            *_argv(tmp, mode, *options),
            env=_env(url),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def line(self) -> str:
        """The next line on stderr."""
        assert self.proc.stderr is not None
        raw = await asyncio.wait_for(self.proc.stderr.readline(), LINE_WITHIN)
        assert raw, f"stderr closed; so far: {self.lines}"
        text = raw.decode().rstrip("\n")
        self.lines.append(text)
        return text

    async def line_with(self, part: str) -> str:
        """The next line that contains ``part`` (lines before it are kept in ``lines``)."""
        while True:
            text = await self.line()
            if part in text:
                return text

    async def exit(self) -> int:
        assert self.proc.stderr is not None
        rest = await asyncio.wait_for(self.proc.stderr.read(), LINE_WITHIN)
        self.lines.extend(rest.decode().splitlines())
        return await asyncio.wait_for(self.proc.wait(), LINE_WITHIN)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def test_the_first_line_says_queued_with_the_position_the_reason_and_the_eta(
    live: Server, tmp_path: Path
) -> None:
    await _setup(live, holds=10)
    holder = await _owner_takes(live)
    wrapper = await Wrapper.start(live.url, tmp_path, "once", "--gpu", "1")
    try:
        first = await wrapper.line()
        request = ok(await live.client.get("/v1/requests", params={"subject": "borrower"}))
        rid = request["items"][0]["id"]
        assert first.startswith(f"respool: request {rid} attempt 1: #1 in queue: "), first
        assert "waiting for gpu: pool 2/2 used, needs 1" in first
        assert re.search(r"; ETA ~\d+[smh] \(90%: within \d+(\.\d)?[smh]\)$", first), first
        ok(await live.client.post(f"/v1/requests/{holder['id']}/release"))
        granted = await wrapper.line_with("allocated")
        assert granted.startswith(f"respool: request {rid} attempt 1: allocated in p after ")
        wrapper.proc.send_signal(signal.SIGTERM)
        assert await wrapper.exit() == 128 + signal.SIGTERM
    finally:
        wrapper.kill()


@pytest.mark.parametrize("grace", [20, 0])
async def test_one_line_per_change_queued_granted_preempting_requeued(
    live: Server, tmp_path: Path, grace: int
) -> None:
    await _setup(live, grace=grace)
    holder = await _owner_takes(live)
    wrapper = await Wrapper.start(live.url, tmp_path, "once", "--gpu", "2", "--max-retries", "1")
    try:
        assert re.search(r"attempt 1: #1 in queue: waiting for gpu: .*" + ETA, await wrapper.line())
        ok(await live.client.post(f"/v1/requests/{holder['id']}/release"))
        assert "attempt 1: allocated in p after " in await wrapper.line_with("allocated")
        taker = await _owner_takes(live)
        taken = await wrapper.line()
        how = r"preempting \(reclaim\)" if grace else "preempted"  # with a grace period or not
        assert re.search(rf"attempt 1: {how}: SIGTERM to CMD's group, SIGKILL in \d", taken), taken
        requeued = await wrapper.line()
        assert requeued.endswith(
            "attempt 1: preempted (reclaim); requeued as attempt 2 (retry 1 of 1)"
        ), requeued
        again = await wrapper.line()
        assert re.search(r"attempt 2: #1 in queue: waiting for gpu: .*" + ETA, again), again
        ok(await live.client.post(f"/v1/requests/{taker['id']}/release"))
        assert "attempt 2: allocated in p after " in await wrapper.line_with("allocated")
        assert await wrapper.exit() == 0
        assert wrapper.lines[-1].startswith("respool: CMD exited with 0; released")
        assert all(line.startswith("respool: ") for line in wrapper.lines), wrapper.lines
    finally:
        wrapper.kill()


async def test_an_unreachable_api_is_reported_before_the_retries_end(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    wrapper = await Wrapper.start(url, tmp_path, "once", "--gpu", "1", "--timeout", "4")
    try:
        first = await wrapper.line()
        assert re.fullmatch(
            rf"respool: cannot reach {url} \(connection refused\); retrying, \d+s left", first
        ), first
        assert await wrapper.exit() == EXIT_API
        assert "giving up after" in wrapper.lines[-1], wrapper.lines
        assert wrapper.lines[-1].startswith("respool: error: POST /v1/requests: ")
        assert len(wrapper.lines) == 2, wrapper.lines  # one line per change, not per try
    finally:
        wrapper.kill()


async def test_an_api_that_accepts_but_does_not_answer_is_reported(tmp_path: Path) -> None:
    with socket.socket() as mute:  # accepts connections (the kernel does), never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        url = f"http://127.0.0.1:{mute.getsockname()[1]}"
        wrapper = await Wrapper.start(url, tmp_path, "once", "--gpu", "1")
        try:
            first = await wrapper.line()
            assert re.fullmatch(
                rf"respool: no answer from {url} yet \(\d+s\); still waiting", first
            )
        finally:
            wrapper.kill()
            await wrapper.proc.wait()


async def test_the_api_lost_while_queued_is_reported_and_the_wait_goes_on(
    db_url: str, tmp_path: Path
) -> None:
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as first:
        await _setup(first)
        holder = await _owner_takes(first)
        port = int(first.url.rsplit(":", 1)[1])
        wrapper = await Wrapper.start(first.url, tmp_path, "once", "--gpu", "1")
        assert "attempt 1: #1 in queue" in await wrapper.line()
    try:
        lost = await wrapper.line_with("cannot reach")
        assert re.search(r"\(connection refused\); retrying, \d+s left$", lost), lost
        async with running_server(
            db_url, with_reconciler=True, reconcile_interval=0.2, port=port
        ) as again:
            back = await wrapper.line()
            assert back.startswith("respool: the API answers again (it was: cannot reach"), back
            ok(await again.client.post(f"/v1/requests/{holder['id']}/release"))
            assert "attempt 1: allocated in p" in await wrapper.line_with("allocated")
            wrapper.proc.send_signal(signal.SIGTERM)
            assert await wrapper.exit() == 128 + signal.SIGTERM
    finally:
        wrapper.kill()


async def test_the_api_lost_while_cmd_runs_is_reported_with_the_lease_left(
    db_url: str, tmp_path: Path
) -> None:
    async with running_server(db_url) as server:
        await _setup(server, grace=0)
        wrapper = await Wrapper.start(server.url, tmp_path, "once", "--gpu", "1", "--lease", "5")
        assert "attempt 1: allocated in p" in await wrapper.line()
    try:
        lost = await wrapper.line_with("cannot reach")
        assert re.search(r"; retrying; CMD keeps running, lease ends in \d+s$", lost), lost
        stop = await wrapper.line_with("no heartbeat got through within the lease")
        assert "SIGTERM to CMD's group" in stop
    finally:
        wrapper.kill()
        await wrapper.proc.wait()


# --- on a terminal: one live line, rewritten in place ------------------------------------------


def _read_pty(fd: int, until: bytes, within: float) -> bytes:
    """What the terminal got until ``until`` appeared (or the other side closed)."""
    got = b""
    end = time.monotonic() + within
    while until not in got and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        got += chunk
    return got


async def test_on_a_terminal_the_wait_is_one_line_rewritten_in_place(
    live: Server, tmp_path: Path
) -> None:
    await _setup(live)
    holder = await _owner_takes(live)
    leader, follower = pty.openpty()
    ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**_env(live.url), "COLUMNS": "80"}
    proc = await asyncio.create_subprocess_exec(
        *_argv(tmp_path, "once", "--gpu", "1"),
        env=env, stdin=follower, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    try:
        loop = asyncio.get_running_loop()
        # Two redraws of the live line: the time waited ticks.
        waiting = await loop.run_in_executor(None, _read_pty, leader, b"for 2s", LINE_WITHIN)
        assert b"for 2s" in waiting, waiting
        ok(await live.client.post(f"/v1/requests/{holder['id']}/release"))
        rest = await loop.run_in_executor(None, _read_pty, leader, b"\n", LINE_WITHIN)
        screen = (waiting + rest).decode()
        *redraws, said = [part for part in screen.split("\r\x1b[2K") if part]
        assert len(redraws) >= 2, screen
        for text in redraws:  # nothing but the one line until the grant
            assert text.startswith("respool: #1 in queue for "), screen
            assert "\n" not in text, screen
            assert len(text) <= 79, text  # cut to the terminal's width
        assert " attempt 1: allocated in p after " in said, screen
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), LINE_WITHIN) == 128 + signal.SIGTERM
    finally:
        if proc.returncode is None:
            proc.kill()
        os.close(leader)


# --- `respool run --help` as people read it ---------------------------------------------------


@pytest.mark.parametrize("columns", [80, 120])
async def test_help_fits_the_terminal_with_plain_metavars_and_whole_examples(
    columns: int,
) -> None:
    proc = await asyncio.create_subprocess_exec(
        *respool_command(), "run", "--help",
        env={**os.environ, "COLUMNS": str(columns)}, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), LINE_WITHIN)
    assert proc.returncode == 0
    text = out.decode()
    assert all(len(line) <= columns for line in text.splitlines()), text
    assert "--max-retries N" in text and "--timeout S" in text and "--gpu N" in text
    usage = text.split("\n\n")[0]
    assert not re.search(r"\b[A-Z]+_[A-Z_]+\b", usage), usage  # no MAX_RETRIES, KILL_AFTER
    examples = text.split("Examples:\n", 1)[1].splitlines()
    assert examples[0].strip().startswith("respool run --subject ") and examples[0].endswith(
        "-- python train.py"
    )
    assert examples[1].endswith(" \\") and examples[2].strip().startswith("--selector ")
    for ref in ("SPEC", "§"):
        assert ref not in text
