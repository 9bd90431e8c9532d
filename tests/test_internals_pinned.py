"""The asyncpg and uvicorn internals respool builds on are still there (docs/reliability.md,
"Library internals").

``app.db.connect.BoundedPool`` overrides asyncpg's private ``Pool._acquire`` and reads
``Pool._queue`` and ``PoolConnectionProxy._holder._timeout`` (the bounded line of calls waiting
for a connection, 429 past it); ``app.api.server`` subclasses uvicorn's ``HttpToolsProtocol``
(one write per answer, header/body timeouts following httptools' parser callbacks, the
connection cap) and ``uvicorn.Server`` (SIGTERM handling). pyproject.toml bounds these libraries
(and httptools) to the versions tested; a test here fails when a new version moves what those
overrides rely on, and its message says what to re-check.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
from collections.abc import Callable
from typing import Any

import asyncpg
import asyncpg.pool
import httptools
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from app.api.server import ApiServer, CoalescingTransport, guarded_protocol
from app.db.connect import ACQUIRE_TIMEOUT, BoundedPool, create_pool

ASYNCPG = (
    f"asyncpg {asyncpg.__version__} moved an internal that app/db/connect.py's BoundedPool "
    "relies on: re-check BoundedPool._acquire (Pool._acquire, Pool._queue, "
    "PoolConnectionProxy._holder._timeout) against the new asyncpg/pool.py, then widen the "
    "asyncpg bound in pyproject.toml"
)
UVICORN = (
    f"uvicorn {uvicorn.__version__} (httptools {httptools.__version__}) moved an internal that "
    "app/api/server.py relies on: re-check GuardedHttpToolsProtocol and CoalescingTransport "
    "(HttpToolsProtocol.connection_made, connection_lost, data_received, the parser callbacks "
    "on_message_begin, on_headers_complete and on_message_complete, on_response_complete, "
    ".transport, .parser, .cycle, .pipeline, .flow, .connections, .loop, send_400_response, "
    "and RequestResponseCycle taking the protocol's transport) and ApiServer.capture_signals "
    "(Server._captured_signals) against the new uvicorn and httptools, then widen their "
    "bounds in pyproject.toml"
)


def _parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


# --- asyncpg -----------------------------------------------------------------------------------


def test_asyncpg_pool_acquire_goes_through_pool_acquire_with_its_timeout() -> None:
    pool_class: Any = asyncpg.Pool
    assert inspect.iscoroutinefunction(pool_class._acquire), ASYNCPG
    assert _parameters(pool_class._acquire) == ["self", "timeout"], ASYNCPG
    assert "_queue" in pool_class.__slots__, ASYNCPG
    assert "_timeout" in asyncpg.pool.PoolConnectionHolder.__slots__, ASYNCPG
    assert "_holder" in asyncpg.pool.PoolConnectionProxy.__slots__, ASYNCPG


async def test_asyncpg_acquire_awaited_and_entered_calls_pool_acquire() -> None:
    calls: list[tuple[str, object]] = []

    class Recorder:
        async def _acquire(self, timeout: float | None) -> str:  # noqa: ASYNC109
            calls.append(("_acquire", timeout))
            return "connection"

        async def release(self, connection: object) -> None:
            calls.append(("release", connection))

    pool: Any = Recorder()
    acquire: Any = asyncpg.Pool.acquire
    assert await acquire(pool) == "connection", ASYNCPG
    async with acquire(pool, timeout=3.0) as conn:
        assert conn == "connection", ASYNCPG
    assert calls == [
        ("_acquire", None),
        ("_acquire", 3.0),
        ("release", "connection"),
    ], ASYNCPG


async def test_asyncpg_queue_holds_the_free_connections_and_release_uses_the_holder_timeout(
    admin_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    released: list[float | None] = []
    holder_release = asyncpg.pool.PoolConnectionHolder.release

    async def recording_release(self: Any, timeout: float | None) -> None:  # noqa: ASYNC109
        released.append(timeout)
        await holder_release(self, timeout)

    monkeypatch.setattr(asyncpg.pool.PoolConnectionHolder, "release", recording_release)
    pool = await create_pool(admin_url, size=1, application_name="respool-test-internals")
    try:
        assert isinstance(pool, BoundedPool)
        internals: Any = pool
        queue = internals._queue
        assert isinstance(queue, asyncio.Queue), ASYNCPG
        assert not queue.empty(), ASYNCPG  # the one connection is free
        conn = await pool.acquire()
        try:
            assert queue.empty(), ASYNCPG  # ... and now taken
            holder: Any = conn._holder
            assert type(holder).__name__ == "PoolConnectionHolder", ASYNCPG
            # Pool._acquire records the acquire's timeout on the holder (BoundedPool passes
            # ACQUIRE_TIMEOUT when the caller names none)...
            assert holder._timeout == ACQUIRE_TIMEOUT, ASYNCPG
            holder._timeout = 7.0
        finally:
            await pool.release(conn)
        # ... and Pool.release bounds the release by it when given no timeout.
        assert released == [7.0], ASYNCPG
        assert not queue.empty(), ASYNCPG
    finally:
        await pool.close()


# --- uvicorn -----------------------------------------------------------------------------------


def test_uvicorn_httptools_protocol_methods_keep_their_signatures() -> None:
    for name, parameters in {
        "__init__": ["self", "config", "server_state", "app_state", "_loop"],
        "connection_made": ["self", "transport"],
        "connection_lost": ["self", "exc"],
        "data_received": ["self", "data"],
        "on_message_begin": ["self"],
        "on_headers_complete": ["self"],
        "on_message_complete": ["self"],
        "on_response_complete": ["self"],
        "send_400_response": ["self", "msg"],
    }.items():
        assert _parameters(getattr(HttpToolsProtocol, name)) == parameters, f"{name}: {UVICORN}"


def cycle_of(protocol: Any) -> Any:
    """The request-response cycle the protocol holds now (read afresh at each call)."""
    return protocol.cycle


def phase(protocol: Any) -> str | None:
    """What the protocol's timer is armed for."""
    return protocol._phase  # type: ignore[no-any-return]


class FakeSocket:
    """A socket transport that records its writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        if data:
            self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    headers = [(b"content-length", b"5")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"hello"})


async def test_uvicorn_cycles_write_through_the_protocols_transport() -> None:
    protocol_class = guarded_protocol(header_timeout=10.0, body_timeout=30.0, max_connections=8)
    config = uvicorn.Config(_hello, http=protocol_class, lifespan="off", log_config=None)
    state = ServerState()
    protocol = protocol_class(config=config, server_state=state, app_state={})
    sock = FakeSocket()
    protocol.connection_made(sock)  # type: ignore[arg-type]
    transport: Any = protocol.transport
    try:
        assert protocol in state.connections, UVICORN
        assert protocol.loop is asyncio.get_running_loop(), UVICORN
        assert isinstance(protocol.parser, httptools.HttpRequestParser), UVICORN
        # connection_made's transport is replaced by the coalescer...
        assert isinstance(transport, CoalescingTransport), UVICORN
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        # ... which the request's cycle writes through ...
        cycle: Any = protocol.cycle
        assert cycle.transport is transport, UVICORN
        await asyncio.wait_for(asyncio.gather(*state.tasks), 10)
        # ... and on_response_complete flushes once the answer is whole: one write.
        assert len(sock.writes) == 1, (sock.writes, UVICORN)
        assert sock.writes[0].startswith(b"HTTP/1.1 200 "), UVICORN
        assert sock.writes[0].endswith(b"\r\n\r\nhello"), UVICORN
    finally:
        protocol.connection_lost(None)
    assert protocol not in state.connections, UVICORN


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _drain(tasks: set[asyncio.Task[None]]) -> None:
    """Until no request cycle runs (a completed answer starts the next pipelined one)."""
    while tasks:
        await asyncio.wait_for(asyncio.gather(*tasks), 10)


async def test_httptools_parser_callbacks_drive_the_timeouts_and_pipelining() -> None:
    protocol_class = guarded_protocol(header_timeout=10.0, body_timeout=30.0, max_connections=8)
    config = uvicorn.Config(_echo, http=protocol_class, lifespan="off", log_config=None)
    state = ServerState()
    protocol: Any = protocol_class(config=config, server_state=state, app_state={})
    sock = FakeSocket()
    protocol.connection_made(sock)
    try:
        assert phase(protocol) == "headers", UVICORN  # armed at connection_made
        # on_message_begin: the headers' timer goes on while the headers come ...
        protocol.data_received(b"POST /a HTTP/1.1\r\nHost: test\r\n")
        assert phase(protocol) == "headers", UVICORN
        assert cycle_of(protocol) is None, UVICORN
        # ... on_headers_complete makes the request's cycle: the body's timer ...
        protocol.data_received(b"Content-Length: 5\r\n\r\nhe")
        assert phase(protocol) == "body", UVICORN
        assert cycle_of(protocol) is not None and not cycle_of(protocol).response_complete, UVICORN
        assert not protocol.pipeline, UVICORN
        # ... on_message_complete: none while the app answers.
        protocol.data_received(b"llo")
        assert phase(protocol) is None, UVICORN
        await _drain(state.tasks)
        assert cycle_of(protocol).response_complete, UVICORN
        assert sock.writes == [sock.writes[0]] and sock.writes[0].endswith(b"hello"), UVICORN
        # Idle: uvicorn's keep-alive timer, not ours.
        assert phase(protocol) is None, UVICORN
        assert protocol.timeout_keep_alive_task is not None, UVICORN
        # A request's head coming while another is answered waits unread (reading paused, as
        # with h11), without a timer until the answer is complete.
        protocol.data_received(b"GET /b HTTP/1.1\r\nHost: test\r\n\r\nGET /c HT")
        assert protocol.timeout_keep_alive_task is None, UVICORN
        assert phase(protocol) is None, UVICORN
        assert protocol.flow.read_paused, UVICORN
        await _drain(state.tasks)
        assert len(sock.writes) == 2, (sock.writes, UVICORN)
        assert not protocol.flow.read_paused, UVICORN
        assert phase(protocol) == "headers", UVICORN  # the next request's, from now
        # Pipelined: the next complete request waits in .pipeline behind the one answered.
        protocol.data_received(b"TP/1.1\r\nHost: test\r\n\r\nGET /d HTTP/1.1\r\nHost: test\r\n\r\n")
        assert len(protocol.pipeline) == 1, UVICORN
        assert phase(protocol) is None, UVICORN
        await _drain(state.tasks)
        assert len(sock.writes) == 4, (sock.writes, UVICORN)
        assert all(w.startswith(b"HTTP/1.1 200 ") for w in sock.writes), UVICORN
        assert not protocol.pipeline, UVICORN
        assert phase(protocol) is None, UVICORN
        # An incomplete head above 16 KiB: 400 and closed (h11's limit).
        protocol.data_received(b"GET /e HTTP/1.1\r\n" + b"X-Filler: " + b"a" * 10_000)
        assert phase(protocol) == "headers", UVICORN
        protocol.data_received(b"a" * 10_000)
        assert sock.closing, UVICORN
        assert sock.writes[-1].startswith(b"HTTP/1.1 400 "), UVICORN
    finally:
        protocol.connection_lost(None)
    assert protocol._timer is None, UVICORN
    assert protocol not in state.connections, UVICORN


def test_uvicorn_server_records_captured_signals_for_capture_signals() -> None:
    assert _parameters(uvicorn.Server.handle_exit) == ["self", "sig", "frame"], UVICORN
    server = ApiServer(uvicorn.Config(_hello), app=None)  # type: ignore[arg-type]
    assert server._captured_signals == [], UVICORN
    with server.capture_signals():
        uvicorn.Server.handle_exit(server, signal.SIGTERM, None)
        assert server._captured_signals == [signal.SIGTERM], UVICORN
    # ApiServer drops SIGTERM before uvicorn would raise it again.
    assert server._captured_signals == [], UVICORN
