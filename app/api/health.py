"""``/healthz`` (the process answers) and ``/readyz`` (DB, schema and listener are fine).

``/readyz`` also names the database node that serves (``node``, host:port as the server sees
it): after a failover it shows the new primary; a standby is not ready.
"""

from __future__ import annotations

import asyncio
from typing import cast

import asyncpg
from litestar import Controller, Response, get
from litestar.datastructures import State
from litestar.openapi.datastructures import ResponseSpec
from respool_client.wire import Readiness

from app.api.common import db, notifier
from app.db import migrate
from app.db.connect import server_role


class HealthController(Controller):
    tags = ["health"]

    @get("/healthz", summary="Liveness")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @get(
        "/readyz",
        summary="Readiness: database reachable and primary, schema current, listener up",
        responses={
            503: ResponseSpec(Readiness, description="Not ready; `detail` says why"),
        },
    )
    async def readyz(self, state: State) -> Response[Readiness]:
        database = schema_current = False
        detail = node = None
        try:
            async with asyncio.timeout(5):
                async with db(state).acquire() as conn:
                    # A pool connection proxy behaves as the connection it wraps.
                    role = await server_role(cast(asyncpg.Connection, conn))
                    node, database = role.node, role.primary
                    schema_current = (await migrate.status(cast(asyncpg.Connection, conn))).current
            if not database:
                detail = f"database {node} is a standby (in recovery), not the primary"
            elif not schema_current:
                detail = "schema is not current (run `respool db migrate`)"
        except Exception as exc:  # any failure means "not ready", never a 500
            detail = f"database unreachable: {type(exc).__name__}"
        listener = notifier(state).healthy
        if detail is None and not listener:
            detail = "notification listener is down"
        ready = database and schema_current and listener
        body = Readiness(
            ready=ready,
            database=database,
            schema_current=schema_current,
            listener=listener,
            detail=detail,
            node=node,
        )
        return Response(body, status_code=200 if ready else 503)
