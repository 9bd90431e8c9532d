"""No connection closes under a request in a burst (docs/ops.md, "Limits").

A burst of creates over hundreds of keep-alive connections used to lose a request now and then
(httpx ``ReadError``): the server closed connections idle for 5 s, exactly the idle expiry of
httpx's pool, so a client could send a request on a connection the server was closing at that
moment. The server now keeps idle connections longer than httpx does. tests/api/burst_repro.py
reproduces the burst itself against ``respool serve``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from app.api import create_app
from app.api.server import KEEP_ALIVE_TIMEOUT, ApiServer, uvicorn_config
from app.settings import Settings
from support.http import pool_with_policy
from support.server import serving


@contextlib.asynccontextmanager
async def serve_like_respool(db_url: str, pool_size: int) -> AsyncIterator[str]:
    """The API with ``respool serve``'s uvicorn configuration, in this event loop."""
    settings = Settings(database_url=db_url, db_pool_size=pool_size, auth="off")
    app = create_app(settings)
    config = uvicorn_config(app, settings, log_level="warning", access_log=False)
    async with serving(ApiServer(config, app)) as port:
        yield f"http://127.0.0.1:{port}"


def test_idle_connections_outlive_the_clients_idle_expiry() -> None:
    # The client must always be the one to give up an idle connection.
    expiry = httpx.Limits(max_connections=1).keepalive_expiry
    assert expiry is not None
    assert expiry < KEEP_ALIVE_TIMEOUT


async def test_a_connection_idle_as_long_as_httpx_keeps_one_is_still_served(db_url: str) -> None:
    expiry = httpx.Limits(max_connections=1).keepalive_expiry
    assert expiry is not None
    async with serve_like_respool(db_url, 2) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        ask = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        writer.write(ask)
        first = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 20)
        assert first.startswith(b"HTTP/1.1 200 ")
        # Idle a little longer than httpx would keep it, then reuse it: the server has not
        # closed it (it used to, at 5 s).
        await asyncio.sleep(expiry + 1.0)
        writer.write(ask)
        second = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 20)
        assert second.startswith(b"HTTP/1.1 200 ")
        writer.close()


@pytest.mark.slow
async def test_a_burst_over_keep_alive_connections_loses_no_request(db_url: str) -> None:
    async with serve_like_respool(db_url, 2) as url:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
            await pool_with_policy(client, capacity={"gpu": 100_000})
            outcomes: collections.Counter[str] = collections.Counter()
            gate = asyncio.Semaphore(100)  # one request per connection in flight

            async def create() -> None:
                try:
                    async with gate:
                        r = await client.post(
                            "/v1/requests",
                            json={"subject": "team", "pool": "p", "resources": {"gpu": 1}},
                        )
                    outcomes[str(r.status_code)] += 1
                except httpx.TransportError as exc:
                    outcomes[type(exc).__name__] += 1

            # Bursts apart by about the old idle timeout, so that connections idle that long.
            for _ in range(3):
                await asyncio.gather(*(create() for _ in range(300)))
                await asyncio.sleep(4.9)
        # Busy answers (503/429) are the client's to retry; a lost connection is not allowed.
        lost = {k: v for k, v in outcomes.items() if not k.isdigit()}
        assert not lost, outcomes
        assert set(outcomes) <= {"201", "429", "503"}, outcomes
