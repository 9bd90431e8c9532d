"""The load generators' retries (bench/retrying.py) against a scripted HTTP server: a 429 is
retried after its ``Retry-After``, a connection closed under a request is reopened and the
request sent again, and a call gives up after its budget instead of hanging."""

from __future__ import annotations

import json

from support.proc import run_python
from support.repo import REPO

SCRIPT = r"""
import asyncio, json, sys, time
from collections import Counter
from bench.retrying import GaveUp, RetryingConnection

SCRIPTED = sys.argv[1].split(",")  # per request: "429", "close" or a final status
arrivals = []

async def handle(reader, writer):
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        length = 0
        for line in head.decode().split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":")[1])
        await reader.readexactly(length)
        arrivals.append(time.monotonic())
        what = SCRIPTED[min(len(arrivals), len(SCRIPTED)) - 1]
        if what == "close":
            writer.close()
            return
        extra = "Retry-After: 0.3\r\n" if what == "429" else ""
        writer.write(f"HTTP/1.1 {what} X\r\n{extra}Content-Length: 2\r\n\r\n{{}}".encode())
        await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    counts = Counter()
    conn = RetryingConnection("127.0.0.1", port, counts, retry_for=float(sys.argv[2]))
    try:
        status = (await conn.call("POST", "/v1/requests", b"{}")).status
    except GaveUp as exc:
        status = str(exc)
    await conn.close()
    server.close()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    print(json.dumps({"status": status, "counts": counts, "gaps": gaps}))

asyncio.run(main())
"""


def _run(scripted: str, retry_for: float) -> dict[str, object]:
    done = run_python("-c", SCRIPT, scripted, str(retry_for), cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    doc: dict[str, object] = json.loads(done.stdout)
    return doc


def test_a_429_is_retried_after_retry_after_and_a_closed_connection_is_reopened() -> None:
    doc = _run("429,close,201", retry_for=30)
    assert doc["status"] == 201
    counts = doc["counts"]
    assert isinstance(counts, dict)
    kinds = {k: n for k, n in counts.items() if k.startswith("transport ")}
    assert counts["429"] == 1 and counts["transport"] == 1 and list(kinds.values()) == [1]
    assert len(counts) == 3
    gaps = doc["gaps"]
    assert isinstance(gaps, list) and len(gaps) == 2
    assert gaps[0] >= 0.3  # Retry-After: 0.3 was waited out before the second try


def test_a_call_that_keeps_failing_gives_up_after_its_budget() -> None:
    doc = _run("503", retry_for=0.5)
    status = doc["status"]
    assert isinstance(status, str) and "gave up" in status and "HTTP 503" in status
    counts = doc["counts"]
    assert isinstance(counts, dict) and counts["503"] >= 1 and set(counts) == {"503"}
