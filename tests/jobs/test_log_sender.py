"""The agent's log sender (``respool_client.agent._Logs``) and the local launcher's output
pipes: every byte a job wrote before it exited reaches the server, in order, whatever the
timing of the sends and the reads (docs/jobs.md, "Logs")."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from respool_client.agent import CHUNK, _Logs
from respool_client.errors import ApiError
from respool_client.launcher import LocalLauncher


class SlowApi:
    """Stores the chunks it is sent; each POST takes ``delay`` seconds (a loaded server), and
    the first ``fail`` ones answer 503 (the send is retried)."""

    def __init__(self, delay: float = 0.05, fail: int = 0) -> None:
        self.delay = delay
        self.fail = fail
        self.got: list[dict[str, Any]] = []
        self.in_flight = asyncio.Event()

    async def call(self, method: str, path: str, body: dict[str, Any]) -> None:
        self.in_flight.set()
        await asyncio.sleep(self.delay)
        if self.fail:
            self.fail -= 1
            raise ApiError(503, "busy")
        self.got.append(dict(body))

    def text(self, stream: str = "stdout") -> str:
        return "".join(c["data"] for c in self.got if c["stream"] == stream)


async def test_output_written_while_a_chunk_is_being_sent_is_sent_too() -> None:
    # An unbuffered print writes "hello from", " ", the id and "\n" separately: the first
    # piece is on its way when the others arrive (they were lost with the chunk in flight).
    api = SlowApi(delay=0.1)
    logs = _Logs(api, "r", 1)  # type: ignore[arg-type]
    logs.write("stdout", b"hello from")
    await asyncio.wait_for(api.in_flight.wait(), 5)
    for piece in (b" ", b"0123-id", b"\n"):
        logs.write("stdout", piece)
    await logs.close(10)
    assert api.text() == "hello from 0123-id\n"
    assert [c["seq"] for c in api.got] == list(range(len(api.got)))


async def test_retried_sends_keep_every_byte_in_order_with_both_streams() -> None:
    api = SlowApi(delay=0.01, fail=3)
    logs = _Logs(api, "r", 2)  # type: ignore[arg-type]
    expected = {"stdout": [], "stderr": []}  # type: dict[str, list[str]]
    for i in range(500):
        stream = "stderr" if i % 7 == 0 else "stdout"
        piece = f"{i}:" + "x" * (i % 50) + ("\n" if i % 3 else "")
        expected[stream].append(piece)
        logs.write(stream, piece.encode())  # type: ignore[arg-type]
        if i % 25 == 0:
            await asyncio.sleep(0.005)
    logs.write("stdout", "é".encode()[:1])  # a split character: completed by close
    await logs.close(30)
    assert api.text("stdout") == "".join(expected["stdout"]) + "\ufffd"
    assert api.text("stderr") == "".join(expected["stderr"])
    assert all(len(c["data"]) <= CHUNK and c["attempt"] == 2 for c in api.got)
    assert [c["seq"] for c in api.got] == list(range(len(api.got)))


async def test_the_launcher_reads_every_byte_a_job_wrote_before_it_exited_however_late() -> None:
    # Small unbuffered writes without a trailing newline, and an agent too busy to read them
    # while the job runs (its event loop blocked until the job has exited): what is in the
    # pipes when the group is gone is read all the same, without waiting.
    script = (
        "import os\n"
        "for i in range(900):\n"
        "    os.write(1, b'%05d' % i + b'.' * 59)\n"
        "os.write(2, b'err-end')\n"
        "os.write(1, b'the-end')\n"
    )
    got: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    proc = await LocalLauncher().start(
        [sys.executable, "-c", script],
        dict(os.environ),
        on_output=lambda stream, data: got[stream].extend(data),
    )
    pid = proc.group.proc.pid
    deadline = time.monotonic() + 30
    while _state(pid) not in ("Z", "X", None):  # blocking: the loop does not read meanwhile
        assert time.monotonic() < deadline
        time.sleep(0.02)  # noqa: ASYNC251
    await proc.drained(0.0)  # no time to wait: what is in the pipes is read at once
    await proc.wait()
    proc.close()
    expected = b"".join(b"%05d" % i + b"." * 59 for i in range(900)) + b"the-end"
    assert len(got["stdout"]) == len(expected) and bytes(got["stdout"]) == expected
    assert bytes(got["stderr"]) == b"err-end"


def _state(pid: int) -> str | None:
    """The process state letter of ``pid`` (Z: exited, not yet reaped); None: gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None
