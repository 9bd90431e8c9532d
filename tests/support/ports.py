"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import socket

__all__ = ["free_port", "listening_socket"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_socket(port: int = 0) -> socket.socket:
    """A TCP socket bound to ``port`` (0: a free one) on 127.0.0.1, not yet listening, for uvicorn.

    ``IPPROTO_TCP``: asyncio sets TCP_NODELAY on accepted connections only when the listening
    socket says it is TCP; with proto 0, Nagle + delayed ACK add ~40 ms to every answer.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock
