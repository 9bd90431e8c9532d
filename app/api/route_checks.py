"""The checks every route makes before its handler runs: who is calling and may they
(:func:`app.api.auth.auth_guard`), and no query parameter the route does not take
(:func:`app.api.query_params.known_query_params`).

They run as middleware, after routing (the route's handler and path parameters are known) and
before the route's own guards, which read the principal set here. As app-level guards they cost
a copy of the route handler per guard and call (Litestar's ``authorize_connection``); here they
cost one connection object per call.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from app.api.auth import auth_guard
from app.api.query_params import known_query_params

__all__ = ["RouteChecks"]


class RouteChecks:
    """ASGI middleware: authentication, authorization and known query parameters (module
    docstring); a refusal is raised as the guards raise it, and answered by the app's handlers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            connection: ASGIConnection[Any, Any, Any, Any] = ASGIConnection(scope, receive, send)
            handler = scope["route_handler"]
            await auth_guard(connection, handler)
            await known_query_params(connection, handler)
        await self.app(scope, receive, send)
