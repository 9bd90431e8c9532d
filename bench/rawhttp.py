"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for load generation.

A client library costs more CPU per request than the server under test on a 2-core machine, so
the load generators speak HTTP themselves: one request at a time per connection,
``Content-Length`` bodies only (what uvicorn sends for JSON answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    first_byte: float  # perf_counter when the first byte of the answer was read


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    async def request(self, method: str, target: str, body: bytes | None = None) -> Reply:
        """Send one request; ``body`` is sent as JSON."""
        self.send(method, target, body)
        assert self._writer is not None
        await self._writer.drain()
        return await self.read_reply()

    def send(self, method: str, target: str, body: bytes | None = None) -> None:
        assert self._writer is not None
        # The real host: an open (token-less) API refuses any Host that is not loopback.
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self._writer.write(head.encode() + b"\r\n" + (body or b""))

    async def read_reply(self) -> Reply:
        assert self._reader is not None
        first = await self._reader.readexactly(1)
        arrived = time.perf_counter()
        head = first + await self._reader.readuntil(b"\r\n\r\n")
        status, length = parse_head(head)
        return Reply(status, await self._reader.readexactly(length), arrived)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()


def parse_head(head: bytes) -> tuple[int, int]:
    """(status, Content-Length, 0 without one) of an HTTP/1.1 answer's head."""
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return int(lines[0].split()[1]), length


def split_url(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)
