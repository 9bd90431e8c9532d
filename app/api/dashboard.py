"""The read-only dashboard: ``/`` (a static page) and ``GET /v1/dashboard`` (the data it polls).

The page and its assets (``/dashboard/…``, shipped in ``app/api/static``) need no token; they
contain no data. The page polls ``GET /v1/dashboard`` every 2 seconds. That route is under
``/v1``, so the usual auth applies: with auth on it needs a ``reader`` or ``admin`` token (the page
asks for one instead of showing the data, says so when the token is rejected, and keeps it in
the browser's session storage). A ``client`` token gets 403, because the dashboard shows every
subject's requests.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from typing import Any

from litestar import Controller, Request, Response, get
from litestar.datastructures import State
from litestar.enums import MediaType
from litestar.params import FromPath

from app.api.auth import AuthError, principal_of
from app.api.common import db
from app.api.errors import error_responses
from app.db import dashboard as db_dashboard
from app.db.dashboard import DashboardData

__all__ = ["DashboardController"]

_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_NO_CACHE = {"Cache-Control": "no-cache"}


@functools.cache
def _static(name: str) -> bytes:
    return (files("app.api") / "static" / name).read_bytes()


class DashboardController(Controller):
    tags = ["dashboard"]

    @get("/", include_in_schema=False, media_type=MediaType.HTML)
    async def page(self) -> Response[bytes]:
        return Response(_static("index.html"), media_type=MediaType.HTML, headers=_NO_CACHE)

    @get("/dashboard/{name:str}", include_in_schema=False)
    async def asset(self, name: FromPath[str]) -> Response[bytes]:
        media_type = _ASSETS.get(name)
        if media_type is None:
            return Response(b"not found\n", status_code=404, media_type=MediaType.TEXT)
        return Response(_static(name), media_type=media_type, headers=_NO_CACHE)

    @get(
        "/v1/dashboard",
        summary="Everything the dashboard shows: pools with usage per key and their nodes (per "
        "device its holder), the queue with what each request waits for and its ETA, current "
        "holders with their labels, running jobs with the last lines of their output, recent "
        "events, invariant violations",
        responses=error_responses(),
    )
    async def data(self, state: State, request: Request[Any, Any, Any]) -> DashboardData:
        principal = principal_of(request)
        if principal.role == "client":
            raise AuthError(
                403,
                f"the dashboard shows every subject; use a reader token (token {principal.name!r})",
            )
        return await db_dashboard.dashboard_data(db(state))
