"""``POST /v1/apply``: declarative pools, policies and nodes in one transaction (admin only).

With ``dry_run`` the whole apply runs, including the engine's grants, rejections and the
reconciler's preemptions, and is then rolled back: the answer is the plan and
its consequences, and nothing changes.
"""

from __future__ import annotations

from typing import Any, cast

import asyncpg
from litestar import Controller, post
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers.base import BaseRouteHandler
from respool_client.manifest import (
    Manifest,
    Plan,
    duplicate_names,
    duplicate_nodes,
    naive_instant,
)

from app.api.auth import AuthError, Principal
from app.api.common import AnyRequest, StrictBody, db, decode_body
from app.api.errors import ApiError
from app.db.apply import apply_manifest

__all__ = ["ApplyController", "ApplyRequest"]


class ApplyRequest(Manifest, forbid_unknown_fields=True, kw_only=True):
    """A manifest plus how to apply it."""

    prune: bool = False
    dry_run: bool = False
    force: bool = False


async def admin_only(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Apply can delete pools: only an admin may call it, also for a dry run."""
    principal = connection.scope.get("state", {}).get("principal")
    if isinstance(principal, Principal) and principal.role != "admin":
        raise AuthError(403, f"only an admin may apply manifests (token {principal.name!r})")


class ApplyController(Controller):
    path = "/v1/apply"
    tags = ["apply"]

    @post("/", status_code=200, guards=[admin_only], summary="Apply (or plan) a manifest")
    async def apply(
        self, state: State, request: AnyRequest, data: StrictBody[ApplyRequest]
    ) -> Plan:
        body = await decode_body(request, ApplyRequest)
        dups = duplicate_names(body)
        if dups:
            raise ApiError(400, "pools: named more than once: " + ", ".join(dups), "pools")
        nodes = duplicate_nodes(body)
        if nodes:
            raise ApiError(400, "nodes: named more than once: " + ", ".join(nodes), "nodes")
        naive = naive_instant(body)
        if naive:
            raise ApiError(400, f"{naive}: a window's instant needs a time zone", naive)
        manifest = Manifest(pools=body.pools, nodes=body.nodes)
        async with db(state).acquire() as conn:
            # A pool connection proxy behaves as the connection it wraps.
            return await apply_manifest(
                cast(asyncpg.Connection, conn),
                manifest,
                prune=body.prune,
                dry_run=body.dry_run,
                force=body.force,
            )
