"""The API under test: in the test's own event loop (:func:`running_server`), or as a real
``respool serve`` process (:class:`ServeProcess`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import uvicorn
from litestar import Litestar

from app.api import create_app
from app.api.server import KEEP_ALIVE_TIMEOUT, ApiServer
from app.db import pools as db_pools
from app.notify import Notifier
from app.settings import Settings
from support.ports import free_port, listening_socket

__all__ = [
    "InProcessServer",
    "ServeProcess",
    "Server",
    "respool_command",
    "running_server",
    "tail",
    "waiting_clients",
]


@dataclass
class Server:
    """A running API: its URL, app, uvicorn server, an httpx client on it, its database."""

    url: str
    app: Litestar
    uvicorn: ApiServer
    client: httpx.AsyncClient
    db_url: str

    @property
    def notifier(self) -> Notifier:
        n: Notifier = self.app.state.notifier
        return n


class InProcessServer(ApiServer):
    """ApiServer without process signal handlers (tests call ``handle_exit`` themselves)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def waiting_clients(server: Server, n: int) -> None:
    """Return once ``n`` long-polls wait in ``server``'s process (at most about 5 s)."""
    for _ in range(500):
        if server.notifier.waiting >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"expected {n} waiters, have {server.notifier.waiting}")


@contextlib.asynccontextmanager
async def busy_pool(server: Server) -> AsyncIterator[None]:
    """Every connection of the server's pool held until the block ends."""
    pool: asyncpg.Pool = server.app.state.db
    held = [await pool.acquire(timeout=10) for _ in range(pool.get_max_size())]
    try:
        yield
    finally:
        for conn in held:
            await pool.release(conn)


@contextlib.asynccontextmanager
async def running_server(
    db_url: str, *, with_reconciler: bool = False, port: int = 0, **overrides: Any
) -> AsyncIterator[Server]:
    """The API on loopback ``port`` (0: a free one; a given one restarts a server in place),
    served by uvicorn in the current event loop.

    Auth is off unless ``overrides`` say otherwise (``auth="on"``, ``admin_token=...``):
    tests/api/test_auth.py covers it; the other API tests are about everything else.
    """
    settings = Settings(
        **{"database_url": db_url, "db_pool_size": 4, "max_wait": 10.0, "auth": "off", **overrides}
    )
    app = create_app(settings, with_reconciler=with_reconciler)
    sock = listening_socket(port)
    # The keep-alive of `respool serve`: uvicorn's default (5 s) equals httpx's idle expiry, so a
    # client could reuse a connection in the instant the server closes it (a ReadError).
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_level="warning",
        ws="none",
        http="httptools",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
    )
    srv = InProcessServer(config, app)
    async with serving(srv, sock) as bound:
        url = f"http://127.0.0.1:{bound}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield Server(url=url, app=app, uvicorn=srv, client=client, db_url=db_url)


ADMIN_TOKEN = "rp_test-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}  # the headers of admin calls


@contextlib.asynccontextmanager
async def admin_server(db_url: str, pool_gpus: int) -> AsyncIterator[Server]:
    """The API with auth on (admin calls with :data:`ADMIN`) and pool ``p`` of ``pool_gpus``
    GPUs."""
    async with running_server(db_url, auth="on", admin_token=ADMIN_TOKEN) as server:
        pool = {"name": "p", "capacity": {"gpu": pool_gpus}}
        response = await server.client.post("/v1/pools", headers=ADMIN, json=pool)
        assert response.status_code == 201, response.text
        yield server


@contextlib.asynccontextmanager
async def serving(server: uvicorn.Server, sock: socket.socket | None = None) -> AsyncIterator[int]:
    """``server`` in the current event loop on ``sock`` (default: a free loopback port), without
    process signal handlers; yields the port. At the end a SIGTERM as ``respool serve`` gets it
    (which also answers any open wait)."""
    sock = sock or listening_socket(0)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(1000):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()
    assert server.started, "server did not start"
    try:
        yield sock.getsockname()[1]
    finally:
        server.handle_exit(signal.SIGTERM, None)
        await asyncio.wait_for(task, 15)
        sock.close()


def tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of a log file ("" when it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def respool_command() -> list[str]:
    """The installed ``respool`` console script (beside this interpreter, else on PATH)."""
    beside = Path(sys.executable).with_name("respool")
    found = str(beside) if beside.exists() else shutil.which("respool")
    assert found, "the respool console script is not installed"
    return [found]


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
        self.log_dir = log_dir
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
        args = [*respool_command(), "serve", "--port", str(self.port)]
        if not self.reconciler:
            args.append("--no-reconciler")
        with open(self.log_path, "ab") as log:
            # cwd: not the checkout, so nothing is imported from the source tree.
            self.proc = subprocess.Popen(
                args, cwd=self.log_dir, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1

    async def ready(self, within: float = 30.0) -> float:
        """Wait until ``/readyz`` answers 200; returns the seconds it took."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"serve exited {self.proc.returncode}:\n{self.log()}")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        return loop.time() - start
                if loop.time() - start > within:
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
        loop = asyncio.get_running_loop()
        start = loop.time()
        while self.proc.poll() is None:
            if loop.time() - start > within:
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
        return tail(self.log_path, chars)

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


async def list_pools_failing(
    server: Server, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> httpx.Response:
    """``GET /v1/pools`` while the database layer's ``list_pools`` raises ``exc`` (it stays so
    for the rest of the test)."""

    async def failing(*_: Any, **__: Any) -> Any:
        raise exc

    monkeypatch.setattr(db_pools, "list_pools", failing)
    return await server.client.get("/v1/pools")
