"""Checks at the edge of the API, before routing reads a body (docs/api.md, open mode).

* **Open mode** (``RESPOOL_AUTH=off``, or bootstrap: no token yet): any web page the operator
  visits could otherwise drive the API (a no-preflight ``fetch``, or DNS rebinding). So while
  the API is open, every request must carry a loopback ``Host`` (``127.0.0.1``, ``localhost``
  or ``[::1]``, each with an optional port; else 403), no ``Origin`` other than the server's
  own (``http(s)://<Host>``; else 403), and a body only as ``application/json`` (else 415).
* **Every mode**: a body that is not ``application/json`` (or ``*/*+json``) is refused (415);
  with auth on, :func:`app.api.auth.auth_guard` checks it after authentication, so a caller
  without a token still learns nothing but 401.
* **Long-poll caps**: at most ``max_waits`` open ``?wait=`` calls per process and
  ``max_waits_per_token`` per ``Authorization`` value; above either, 429 with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import msgspec
from litestar.enums import ScopeType
from litestar.types import (
    ASGIApp,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    Receive,
    Scope,
    Send,
)
from respool_client.wire import ErrorBody

from app.api.body_type import Headers, body_type_problem

if TYPE_CHECKING:
    from app.api.auth import Authenticator

__all__ = ["EdgeGuard", "is_loopback_host", "origin_problem"]

_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
_PORT = re.compile(r"^[0-9]{1,5}$")


def _headers(scope: Scope) -> Headers:
    out: Headers = {}
    for k, v in scope.get("headers", ()):
        out.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
    return out


def is_loopback_host(host: str) -> bool:
    """``127.0.0.1``, ``localhost`` or ``[::1]``, each with an optional ``:port``."""
    h = host.strip().lower()
    if h.startswith("["):
        name, _, rest = h.partition("]")
        name += "]"
        port = rest[1:] if rest.startswith(":") else None
        if rest and port is None:
            return False
    else:
        name, sep, port_text = h.partition(":")
        port = port_text if sep else None
    if port is not None and not _PORT.match(port):
        return False
    return name in _LOOPBACK_NAMES


def origin_problem(headers: Headers) -> str | None:
    """Why ``Host``/``Origin`` are refused while the API is open (None: fine)."""
    host = headers.get("host", "")
    if not is_loopback_host(host):
        return (
            f"Host {host!r} refused: while the API is open (no token yet, or RESPOOL_AUTH=off) "
            "only 127.0.0.1, localhost or [::1] are accepted"
        )
    origin = headers.get("origin")
    if origin is not None:
        own = {f"http://{host.strip().lower()}", f"https://{host.strip().lower()}"}
        if origin.strip().lower() not in own:
            return (
                f"Origin {origin!r} refused: while the API is open (no token yet, or "
                "RESPOOL_AUTH=off) cross-site requests are not accepted"
            )
    return None


def _wait_requested(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    if not path.startswith("/v1/requests"):
        return False
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    for value in query.get("wait", ()):
        try:
            if float(value) > 0:
                return True
        except ValueError:
            return False  # the route answers 400
    return False


async def _refuse(
    send: Send, status: int, detail: str, extra: Iterable[tuple[str, str]] = ()
) -> None:
    body = msgspec.json.encode(ErrorBody(status, detail, None))
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in extra),
    ]
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": status,
        "headers": headers,
    }
    await send(start)
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(end)


class EdgeGuard:
    """ASGI middleware: the open-mode checks and the long-poll caps (module docstring)."""

    def __init__(
        self, app: ASGIApp, *, auth: Authenticator, max_waits: int, max_waits_per_token: int
    ) -> None:
        self.app = app
        self.auth = auth
        self.max_waits = max_waits
        self.max_waits_per_token = max_waits_per_token
        self.waits: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if await self.auth.is_open(scope):
            problem = origin_problem(headers)
            if problem is not None:
                await _refuse(send, 403, problem)
                return
            problem = body_type_problem(str(scope.get("method", "GET")), headers)
            if problem is not None:
                await _refuse(send, 415, problem)
                return
        if not _wait_requested(scope):
            await self.app(scope, receive, send)
            return
        key = hashlib.sha256(headers.get("authorization", "").encode()).hexdigest()
        if self.waits.total() >= self.max_waits or self.waits[key] >= self.max_waits_per_token:
            which = "this process" if self.waits.total() >= self.max_waits else "this token"
            await _refuse(
                send,
                429,
                f"too many open waits for {which}; retry later or call without wait",
                [("retry-after", "1")],
            )
            return
        self.waits[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.waits[key] -= 1
            if self.waits[key] <= 0:
                del self.waits[key]
