"""One write per answer (docs/api.md, "One write per answer"): on a real server with
``respool serve``'s protocol, a complete answer leaves the process in one transport write
(head and body together), on keep-alive and ``Connection: close`` connections, for errors and
HEAD requests too; a streamed answer still gets its head out before its body exists."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from app.api import create_app
from app.api.server import ApiServer, GuardedHttpToolsProtocol, guarded_protocol, uvicorn_config
from app.settings import Settings
from support.server import serving


def parse_head(head: bytes) -> tuple[int, int]:
    """(status, Content-Length, 0 without one) of an HTTP/1.1 answer's head."""
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        (
            int(v)
            for n, _, v in (x.partition(":") for x in lines[1:])
            if n.strip().lower() == "content-length"
        ),
        0,
    )
    return int(lines[0].split()[1]), length


class CountingTransport:
    """The socket's transport, recording each ``write()`` it is given (but empty ones, which
    send nothing)."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self.writes = writes

    def write(self, data: bytes) -> None:
        if data:
            self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def counting_protocol(writes: list[bytes]) -> type[GuardedHttpToolsProtocol]:
    base = guarded_protocol(header_timeout=10.0, body_timeout=30.0, max_connections=1000)

    class Counting(base):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(CountingTransport(transport, writes))

    return Counting


async def read_answer(reader: asyncio.StreamReader, *, head: bool = False) -> bytes:
    """One HTTP/1.1 answer with a Content-Length (no body for HEAD, 204 or 304)."""
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    status, length = parse_head(raw)
    if head or status in (204, 304) or 100 <= status < 200:
        return raw
    return raw + await asyncio.wait_for(reader.readexactly(length), 20)


def request(method: str, path: str, body: bytes = b"", *, close: bool = False) -> bytes:
    headers = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if body:
        headers += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    if close:
        headers.append("Connection: close")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


async def test_each_answer_of_the_api_leaves_in_one_write(db_url: str) -> None:
    writes: list[bytes] = []
    settings = Settings(database_url=db_url, db_pool_size=2, auth="off")
    app = create_app(settings)
    config = uvicorn_config(
        app, settings, http=counting_protocol(writes), log_level="warning", access_log=False
    )
    async with serving(ApiServer(config, app)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        exchanges = [
            (request("GET", "/healthz"), False, 200),
            (request("POST", "/v1/pools", b'{"name": "p", "capacity": {"gpu": 2}}'), False, 201),
            (request("POST", "/v1/pools", b'{"name": "p", "capacity": {"gpu": 2}}'), False, 409),
            (request("POST", "/v1/pools", b"{not json"), False, 400),
            (request("GET", "/v1/pools/nope"), False, 404),
            (request("HEAD", "/healthz"), True, None),
            (request("GET", "/v1/pools/p"), False, 200),
        ]
        for raw, head, status in exchanges:
            before = len(writes)
            writer.write(raw)
            answer = await read_answer(reader, head=head)
            if status is not None:
                assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
            # Everything the client read came in one write, and nothing else was written.
            assert writes[before:] == [answer], (raw, writes[before:])
        # A pipelined pair: one write per answer, in order.
        before = len(writes)
        writer.write(request("GET", "/healthz") + request("GET", "/v1/pools/p"))
        first = await read_answer(reader)
        second = await read_answer(reader)
        assert writes[before:] == [first, second]
        # Connection: close: the answer in one write, then the server closes.
        before = len(writes)
        writer.write(request("GET", "/healthz", close=True))
        last = await read_answer(reader)
        assert await asyncio.wait_for(reader.read(), 20) == b""
        assert writes[before:] == [last]
        assert b"connection: close" in last.lower()
        writer.close()


async def test_a_streamed_answer_sends_its_head_before_its_body() -> None:
    writes: list[bytes] = []
    head_seen = asyncio.Event()

    async def streaming_app(scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        await head_seen.wait()  # the body exists only once the client has read the head
        await send({"type": "http.response.body", "body": b"hello", "more_body": True})
        await send({"type": "http.response.body", "body": b" world", "more_body": False})

    config = uvicorn.Config(
        streaming_app,
        http=counting_protocol(writes),
        lifespan="off",
        ws="none",
        log_level="warning",
        access_log=False,
    )
    async with serving(uvicorn.Server(config)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("GET", "/stream"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"transfer-encoding: chunked" in head.lower()
        assert writes == [head]
        head_seen.set()
        body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 20)
        assert body == b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        writer.close()
