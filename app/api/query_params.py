"""A request that changes state names only query parameters its route takes (docs/api.md).

Litestar ignores a query parameter a route does not declare. On a route that changes state
that is dangerous: ``?dryrun=true`` (for ``dry_run``) or ``?dry_run=true`` on the batch route
(which has no what-if) would create for real. :func:`known_query_params` runs for every route
(:mod:`app.api.route_checks`), so it holds for every ``POST``/``PUT``/``PATCH``/``DELETE`` route
at once: an unknown parameter is 400 naming it, before the handler runs and before anything is
changed.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from app.api.errors import ApiError

__all__ = ["known_query_params"]

_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# The query parameters each route handler takes, by handler (its identity) and path parameters.
_taken: dict[tuple[BaseRouteHandler, frozenset[str]], frozenset[str]] = {}


def _query_names(handler: BaseRouteHandler, path_params: frozenset[str]) -> frozenset[str]:
    key = (handler, path_params)
    names = _taken.get(key)
    if names is None:
        model = handler.create_kwargs_model(path_parameters=dict.fromkeys(path_params))  # type: ignore[arg-type]
        names = _taken[key] = frozenset(p.field_alias for p in model.expected_query_params)
    return names


async def known_query_params(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Guard: 400 naming the first query parameter a state-changing route does not take."""
    if connection.scope.get("method") not in _STATE_CHANGING or not connection.query_params:
        return
    taken = _query_names(handler, frozenset(connection.path_params))
    for name in connection.query_params:
        if name not in taken:
            known = ", ".join(sorted(taken)) or "none"
            raise ApiError(
                400,
                f"{name}: unknown query parameter (this route takes: {known})",
                name[:70],
            )
