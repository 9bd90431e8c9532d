"""A small TCP proxy for network faults between the API and PostgreSQL (loopback only).

``FaultProxy(upstream_port)`` listens on a free 127.0.0.1 port and forwards every connection to
``127.0.0.1:upstream_port``. Its mode can change at any time:

* ``pass``: forward as is;
* ``latency``: forward every chunk after ``latency_ms`` (each direction);
* ``blackhole``: accept, but forward nothing: held bytes stay in the proxy (like packets lost
  and retransmitted later) and are delivered once the mode changes back; a new connection is
  accepted but not connected upstream until then;
* ``reset``: abort every open connection with a TCP RST, and reset new ones at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Literal

__all__ = ["FaultProxy", "Mode"]

Mode = Literal["pass", "latency", "blackhole", "reset"]
_CHUNK = 65536


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.mode: Mode = "pass"
        self.latency_ms = 0.0
        self.connections = 0  # accepted so far
        self.resets = 0  # connections aborted with RST
        self._flowing = asyncio.Event()  # set unless blackholed
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def dsn_host(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def set_mode(self, mode: Mode, latency_ms: float = 0.0) -> None:
        self.mode = mode
        self.latency_ms = latency_ms if mode == "latency" else 0.0
        if mode == "blackhole":
            self._flowing.clear()
        else:
            self._flowing.set()
        if mode == "reset":
            for down, up in list(self._open):
                self.resets += 1
                _rst(down)
                if up is not None:
                    _rst(up)
            self._open.clear()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.set_mode("reset")
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.mode == "reset":
            self.resets += 1
            _rst(writer)
            return
        await self._flowing.wait()  # blackholed: the connection is accepted, nothing more
        if self.mode == "reset":
            self.resets += 1
            _rst(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _rst(writer)
            return
        pair = (writer, up_writer)
        self._open.add(pair)
        tasks = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            self._tasks.difference_update(tasks)
            if pair in self._open:
                self._open.discard(pair)
                for w in pair:
                    w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await self._flowing.wait()
                if self.latency_ms:
                    await asyncio.sleep(self.latency_ms / 1000)
                if writer.is_closing():
                    break
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            if not writer.is_closing() and writer.can_write_eof():
                writer.write_eof()
