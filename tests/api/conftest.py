"""API tests: a real uvicorn server in the test's event loop, against a database of its own."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from litestar import Litestar

from app.api import create_app
from app.api.server import ApiServer
from app.notify import Notifier
from app.settings import Settings


@dataclass
class Server:
    url: str
    app: Litestar
    uvicorn: ApiServer
    client: httpx.AsyncClient
    db_url: str

    @property
    def notifier(self) -> Notifier:
        n: Notifier = self.app.state.notifier
        return n


class _TestServer(ApiServer):
    """ApiServer without process signal handlers (tests call ``handle_exit`` themselves)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def running_server(
    db_url: str, *, with_reconciler: bool = False, **overrides: Any
) -> AsyncIterator[Server]:
    """The API on a free loopback port, served by uvicorn in the current event loop.

    Auth is off unless ``overrides`` say otherwise (``auth="on"``, ``admin_token=...``):
    tests/api/test_auth.py covers it; the other API tests are about everything else.
    """
    settings = Settings(
        **{
            "database_url": db_url,
            "db_pool_size": 4,
            "max_wait": 10.0,
            "auth": "off",
            **overrides,
        }
    )
    app = create_app(settings, with_reconciler=with_reconciler)
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only when the listening
    # socket says it is TCP; with proto 0, Nagle + delayed ACK add ~40 ms to every answer.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", ws="none", http="h11", access_log=False
    )
    srv = _TestServer(config, app)
    task = asyncio.create_task(srv.serve(sockets=[sock]))
    for _ in range(500):
        if srv.started or task.done():
            break
        await asyncio.sleep(0.01)
    if task.done():
        task.result()
    assert srv.started, "server did not start"
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        try:
            yield Server(url=url, app=app, uvicorn=srv, client=client, db_url=db_url)
        finally:
            srv.handle_exit(signal.SIGTERM, None)  # also answers any open wait
            await asyncio.wait_for(task, 15)
            sock.close()


@pytest.fixture
async def server(db_url: str) -> AsyncIterator[Server]:
    """A server with a database of this test's own."""
    async with running_server(db_url) as srv:
        yield srv


@pytest.fixture(scope="module")
async def module_server(module_db_url: str) -> AsyncIterator[Server]:
    """A server shared by one module (tests that only read, or fail before writing)."""
    async with running_server(module_db_url) as srv:
        yield srv
