"""Shared pieces of the fault tests: short/long mode, figures, a ``respool serve`` subprocess,
an invariant auditor and a few database checks.

Short mode (the default, run by ``.ci/run``) keeps every test to tens of seconds; long mode
(``RESPOOL_FAULTS=long`` or ``pytest tests/faults --faults-long``) runs the bigger counts and
durations of docs/reliability.md. Every loop here is bounded in count and time, and everything
listens on and talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import asyncpg
import httpx

from app.db.connect import APP_CLI, connect
from tests.faults.pg import free_port

__all__ = [
    "FIGURES",
    "REPO",
    "Auditor",
    "ServeProcess",
    "database_fingerprint",
    "direct",
    "long_mode",
    "pick",
    "record",
    "wait_until",
]

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# (test, figures) of this session, printed in the terminal summary (tests/faults/conftest.py).
FIGURES: list[tuple[str, dict[str, Any]]] = []


def long_mode() -> bool:
    """True for the long runs (``RESPOOL_FAULTS=long`` or ``--faults-long``)."""
    return os.environ.get("RESPOOL_FAULTS", "").strip().lower() == "long"


def pick(short: T, long: T) -> T:
    """``short`` in short mode, ``long`` in long mode."""
    return long if long_mode() else short


def record(test: str, **figures: Any) -> None:
    """Keep a test's figures for the summary; also append them as one JSON line to
    ``$RESPOOL_FAULTS_FIGURES`` when set."""
    figures = {"mode": "long" if long_mode() else "short", **figures}
    FIGURES.append((test, figures))
    print(f"\n[faults] {test}: {json.dumps(figures, default=str)}", file=sys.stderr)
    target = os.environ.get("RESPOOL_FAULTS_FIGURES")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": test, **figures}, default=str) + "\n")


async def wait_until(
    check: Callable[[], Awaitable[bool]], what: str, *, within: float = 20.0, step: float = 0.05
) -> float:
    """Poll ``check`` until true; returns the seconds it took (AssertionError after
    ``within`` seconds)."""
    start = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(step)


# --- a real `respool serve` process ------------------------------------------------------------


class ServeProcess:
    """``respool serve`` as a subprocess on a free loopback port, auth off, output to a file."""

    def __init__(
        self,
        db_url: str,
        log_dir: Path,
        *,
        port: int | None = None,
        reconciler: bool = True,
        name: str = "serve",
        **env: str,
    ) -> None:
        self.db_url = db_url
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.reconciler = reconciler
        self.log_path = log_dir / f"{name}-{self.port}.log"
        self.env = {
            **os.environ,
            "RESPOOL_DATABASE_URL": db_url,
            "RESPOOL_HOST": "127.0.0.1",
            "RESPOOL_PORT": str(self.port),
            "RESPOOL_AUTH": "off",
            "RESPOOL_LOG_LEVEL": "WARNING",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        """Start the process (call :meth:`ready` to wait for it)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        args = [sys.executable, "-m", "cli.main", "serve", "--port", str(self.port)]
        if not self.reconciler:
            args.append("--no-reconciler")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1

    async def ready(self, within: float = 30.0) -> float:
        """Wait until ``/readyz`` answers 200; returns the seconds it took."""
        start = time.monotonic()
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"serve exited {self.proc.returncode}:\n{self.log()}")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        return time.monotonic() - start
                if time.monotonic() - start > within:
                    raise AssertionError(f"serve not ready after {within} s:\n{self.log()}")
                await asyncio.sleep(0.05)

    def send(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    async def wait_exit(self, within: float) -> int:
        assert self.proc is not None
        start = time.monotonic()
        while self.proc.poll() is None:
            if time.monotonic() - start > within:
                raise AssertionError(f"serve still running {within} s after the signal")
            await asyncio.sleep(0.02)
        return int(self.proc.returncode)

    def rss_bytes(self) -> int:
        """Resident set size of the process (Linux /proc)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def log(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        """Stop for good (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# --- the auditor -------------------------------------------------------------------------------


class Auditor:
    """Reads ``respool.invariant_violations`` in a REPEATABLE READ snapshot every ``interval``
    seconds on a connection of its own (reconnecting while the database is away)."""

    def __init__(self, dsn: str, *, interval: float = 0.2) -> None:
        self.dsn = dsn
        self.interval = interval
        self.snapshots = 0
        self.violations: list[str] = []
        self.outages = 0  # snapshots that could not be taken (database away)
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def check_once(self, conn: asyncpg.Connection) -> None:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            rows = await conn.fetch(
                "SELECT invariant, pool, subject, key, detail FROM respool.invariant_violations"
            )
        self.snapshots += 1
        self.violations.extend(
            f"{r['invariant']} {r['pool']} {r['subject']} {r['key']}: {r['detail']}" for r in rows
        )

    async def _run(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.is_closed():
                        conn = await connect(self.dsn, application_name="respool-auditor")
                    await asyncio.wait_for(self.check_once(conn), 10)
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    self.outages += 1
                    if conn is not None:
                        conn.terminate()
                    conn = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)
        finally:
            if conn is not None:
                conn.terminate()

    async def __aenter__(self) -> Auditor:
        self._task = asyncio.create_task(self._run(), name="faults-auditor")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)
        if exc_type is None:  # one last look at the final state
            conn = await connect(self.dsn, application_name="respool-auditor")
            try:
                await self.check_once(conn)
            finally:
                await conn.close()


# --- database checks ---------------------------------------------------------------------------

_TABLES = (
    "pools", "pool_resources", "policies", "policy_resources", "requests", "events", "tokens",
)  # fmt: skip


async def database_fingerprint(dsn: str) -> dict[str, str]:
    """An md5 of every row of each respool base table (order-independent): equal fingerprints
    before and after a call mean the call changed nothing."""
    conn = await connect(dsn, application_name=APP_CLI)
    try:
        out: dict[str, str] = {}
        for table in _TABLES:
            digest = "coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')"
            sql = f"SELECT count(*) || ':' || {digest} FROM respool.{table} t"  # noqa: S608
            out[table] = await conn.fetchval(sql)
        return out
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def direct(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own (respool codecs)."""
    conn = await connect(dsn, application_name=APP_CLI)
    try:
        yield conn
    finally:
        await conn.close()


async def serves_again(client: httpx.AsyncClient) -> bool:
    """True when the API reads and writes again: a pool list, then a create and its cancel."""
    try:
        if (await client.get("/v1/pools", timeout=5)).status_code != 200:
            return False
        body = {"subject": "a", "resources": {"gpu": 1}, "idempotency_key": str(uuid.uuid4())}
        r = await client.post("/v1/requests", json=body, timeout=5)
        if r.status_code != 201:
            return False
        await client.post(f"/v1/requests/{r.json()['id']}/cancel", timeout=5)
        return True
    except httpx.TransportError:
        return False


async def contended_pool(client: httpx.AsyncClient) -> None:
    """Pool ``p`` of 6 GPUs: subject ``a`` reserves 3, ``b`` only borrows (preemption happens)."""
    r = await client.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 6}})
    assert r.status_code == 201, r.text
    for subject, reserved in (("a", {"gpu": 3}), ("b", {})):
        body = {"subject": subject, "pool": "p", "reserved": reserved}
        r = await client.post("/v1/policies", json=body)
        assert r.status_code == 201, r.text
