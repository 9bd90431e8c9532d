"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "listening_socket"]

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000


def _below_ephemeral() -> range:
    """Ports under the kernel's ephemeral range (empty where the range cannot be read)."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(_LOWEST, low)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Taken below the ephemeral range where the kernel says where that is: a port handed out by
    ``bind(0)`` can be taken again by any outgoing connection (as its local port) before the
    server that was meant to listen on it starts, which a cluster booting for a minute does meet.
    """
    candidates = _below_ephemeral()
    for _ in range(64 if candidates else 0):
        port = random.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
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
