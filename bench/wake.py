"""Wake latency: how long after a release commits does a long-polling waiter get its answer?

Setup: a fresh database on the server at ``--dsn`` (dropped afterwards), a ``respool serve``
process on a free loopback port (auth off, no reconciler, log level WARNING), one pool with one
GPU and one policy.

Each round: request A holds the GPU; request B is queued and its client long-polls
``GET /v1/requests/{B}?wait=20&version=V``. Once the server reports the waiter registered
(``respool_waiters`` in ``/metrics``), A is released by ``respool.release_request`` in a
transaction on a direct asyncpg connection. Latency = the moment B's HTTP answer arrived minus
the moment the COMMIT returned. B then holds the GPU for the next round. Rounds alternate
between two clients for the long-poll: a raw HTTP/1.1 connection (arrival = the first byte of
the answer: the server's latency) and httpx (arrival = httpx returned the answer: what a Python
client such as ``respool_client`` sees).

For reference, the same run measures the raw NOTIFY round trip: ``NOTIFY`` committed on one
connection, minus the moment the LISTEN callback of another connection (in its own thread and
event loop, like the server's listener in its own process) fires.

Timings use ``time.perf_counter`` (CLOCK_MONOTONIC) in this process only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from app.db.dsn import redact_dsn, with_database
from bench.rawhttp import Connection, Reply

SUMMARY = "wake latency of a long-poll after a release (and the raw NOTIFY round trip)"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
RAW_CHANNEL = "respool_bench_raw"
REPO = Path(__file__).resolve().parent.parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wakes", type=int, default=300, help="measured rounds (default 300)")
    parser.add_argument(
        "--warmup", type=int, default=20, help="unmeasured rounds first (default 20)"
    )
    parser.add_argument(
        "--dsn",
        default=DEFAULT_DSN,
        help="a PostgreSQL server where we may CREATE DATABASE (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


# --- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Summary:
    n: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Summary:
        ms = [s * 1000 for s in seconds]
        return cls(
            n=len(ms),
            min_ms=min(ms),
            p50_ms=percentile(ms, 50),
            p90_ms=percentile(ms, 90),
            p99_ms=percentile(ms, 99),
            max_ms=max(ms),
        )

    def line(self) -> str:
        return (
            f"p50 {self.p50_ms:.3f} ms  p90 {self.p90_ms:.3f} ms  p99 {self.p99_ms:.3f} ms  "
            f"max {self.max_ms:.3f} ms  min {self.min_ms:.3f} ms  (n={self.n})"
        )


# --- database and server ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_database(admin_dsn: str) -> AsyncIterator[str]:
    """A new, empty database on ``admin_dsn``'s server; dropped on exit."""
    name = f"respool_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_dsn, timeout=30)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        try:
            yield with_database(admin_dsn, name)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(dsn: str, **settings: Any) -> Iterator[str]:
    """``respool serve`` on a free loopback port against ``dsn``; yields its base URL.
    ``settings``: :func:`serve_process`'s."""
    with serve_process(dsn, **settings) as (url, _proc):
        yield url


def serve_has_option(option: str) -> bool:
    """Whether ``respool serve --help`` of this checkout lists ``option``."""
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--help"],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return option in done.stdout


@contextlib.contextmanager
def serve_process(
    dsn: str,
    *,
    reconciler: bool = False,
    env: dict[str, str] | None = None,
    options: Sequence[str] = (),
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``respool serve`` on a free loopback port against ``dsn``; yields its base URL and its
    process (for its RSS). ``options``: more command-line options of ``respool serve``
    (``--workers 2``)."""
    port = _free_port()
    full_env = {
        **os.environ,
        "RESPOOL_DATABASE_URL": dsn,
        "RESPOOL_HOST": "127.0.0.1",
        "RESPOOL_AUTH": "off",
        "RESPOOL_LOG_LEVEL": "WARNING",
        "RESPOOL_MAX_WAIT": "25",
        **(env or {}),
    }
    command = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), *options]
    if not reconciler:
        command.append("--no-reconciler")
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            command, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(proc, url, log)
            yield url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"respool serve exited:\n{log.read().decode(errors='replace')}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit("respool serve did not become ready within 60 s")


# --- raw NOTIFY round trip -------------------------------------------------------------------


class RawListener:
    """A LISTEN connection in its own thread and event loop; ``arrivals`` gets the
    ``perf_counter`` of each notification as its callback runs."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self.arrivals: queue.Queue[float] = queue.Queue()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="raw-listener", daemon=True)

    def __enter__(self) -> RawListener:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _main(self) -> None:
        asyncio.run(self._listen())

    async def _listen(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            conn = await asyncpg.connect(self._dsn, timeout=30)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        try:
            await conn.add_listener(RAW_CHANNEL, lambda *_: self.arrivals.put(time.perf_counter()))
            self._ready.set()
            await self._stop.wait()
        finally:
            await conn.close()


async def measure_raw_notify(dsn: str, rounds: int, warmup: int) -> list[float]:
    samples: list[float] = []
    loop = asyncio.get_running_loop()
    with RawListener(dsn) as listener:
        sender = await asyncpg.connect(dsn, timeout=30)
        try:
            for i in range(warmup + rounds):
                await sender.execute(f"NOTIFY {RAW_CHANNEL}, '{i}'")  # its own transaction
                committed = time.perf_counter()
                arrived = await loop.run_in_executor(None, listener.arrivals.get, True, 10.0)
                if i >= warmup:
                    samples.append(arrived - committed)
        finally:
            await sender.close()
    return samples


# --- HTTP wake latency -----------------------------------------------------------------------


async def _waiters(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("respool_waiters "):
            return float(line.split()[1])
    raise SystemExit("GET /metrics has no respool_waiters gauge")


async def _until_waiting(http: httpx.AsyncClient, n: int) -> None:
    for _ in range(2000):
        if await _waiters(http) >= n:
            return
        await asyncio.sleep(0.002)
    raise SystemExit("the long-poll never registered with the server")


def _check(status: int, body: bytes, expected: int) -> dict[str, Any]:
    if status != expected:
        raise SystemExit(f"unexpected answer {status}: {body.decode(errors='replace')}")
    doc: dict[str, Any] = json.loads(body)
    return doc


async def _httpx_get(http: httpx.AsyncClient, target: str) -> Reply:
    """``first_byte`` here: when httpx handed over the whole answer (what a Python client sees)."""
    response = await http.get(target)
    return Reply(response.status_code, response.content, time.perf_counter())


@dataclass
class WakeSamples:
    raw: list[float]  # first byte of the answer, on a raw HTTP/1.1 connection
    httpx: list[float]  # the answer as returned by httpx


async def measure_wakes(url: str, dsn: str, rounds: int, warmup: int) -> WakeSamples:
    """Latencies in seconds (negative when the answer was read before the COMMIT returned);
    rounds alternate between the two clients, ``rounds`` measured for each."""
    samples = WakeSamples(raw=[], httpx=[])
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    host, port = url.removeprefix("http://").split(":")
    # The raw connection's time is the first byte of the answer: the server's figure.
    raw = await Connection(host, int(port)).open()
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:

        async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            r = await http.post(path, json=body)
            return _check(r.status_code, r.content, 201)

        await post("/v1/pools", {"name": "bench", "capacity": {"gpu": 1}})
        await post("/v1/policies", {"subject": "bench", "pool": "bench"})
        body = {"subject": "bench", "resources": {"gpu": 1}, "lease_seconds": None}
        holder = await post("/v1/requests", body)
        if holder["status"] != "allocated":
            raise SystemExit(f"the first request was not allocated: {holder}")
        conn = await asyncpg.connect(dsn, timeout=30)
        try:
            for i in range(2 * (warmup + rounds)):
                waiter = await post("/v1/requests", body)
                if waiter["status"] != "queued":
                    raise SystemExit(f"the waiting request was not queued: {waiter}")
                target = f"/v1/requests/{waiter['id']}?wait=20&version={waiter['version']}"
                use_raw = i % 2 == 0
                poll = asyncio.create_task(
                    raw.request("GET", target) if use_raw else _httpx_get(http, target)
                )
                await _until_waiting(http, 1)
                async with conn.transaction():
                    await conn.execute(
                        "SELECT respool.release_request(p_id => $1)", uuid.UUID(holder["id"])
                    )
                committed = time.perf_counter()
                answer = await poll
                woken = _check(answer.status, answer.body, 200)
                if woken["status"] != "allocated" or woken["id"] != waiter["id"]:
                    raise SystemExit(f"the waiter was not granted: {woken}")
                if i >= 2 * warmup:
                    (samples.raw if use_raw else samples.httpx).append(
                        answer.first_byte - committed
                    )
                holder = woken
        finally:
            await conn.close()
            await raw.close()
    return samples


# --- entry point -----------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> dict[str, Summary]:
    async with fresh_database(args.dsn) as dsn:
        raw = await measure_raw_notify(dsn, args.wakes, args.warmup)
        with serve(dsn) as url:
            wakes = await measure_wakes(url, dsn, args.wakes, args.warmup)
    return {
        "wake": Summary.of(wakes.raw),
        "wake_httpx": Summary.of(wakes.httpx),
        "raw_notify": Summary.of(raw),
    }


def run(args: argparse.Namespace) -> int:
    if args.wakes < 1 or args.warmup < 0:
        raise SystemExit("--wakes must be >= 1 and --warmup >= 0")
    result = asyncio.run(_run(args))
    if args.json:
        print(json.dumps({k: v.__dict__ for k, v in result.items()}))
        return 0
    print(
        f"respool wake latency: {args.wakes} measured wakes per client "
        f"(after {args.warmup} warm-up wakes each)"
    )
    print(f"  server: respool serve (subprocess) on {redact_dsn(args.dsn)}, fresh database")
    print("  wake        (release COMMIT returned -> first byte of the waiter's HTTP answer)")
    print(f"              {result['wake'].line()}")
    print("  wake, httpx (the same, until httpx returned the answer: what a Python client sees)")
    print(f"              {result['wake_httpx'].line()}")
    print("  raw NOTIFY  (NOTIFY committed -> LISTEN callback on another connection)")
    print(f"              {result['raw_notify'].line()}")
    print("  (a negative time: the answer was read before this process saw its COMMIT return)")
    return 0
