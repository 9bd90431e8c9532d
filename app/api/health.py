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
        body = Readiness(ready=False, database=False, schema_current=False, listener=False)
        try:
            async with asyncio.timeout(5):
                async with db(state).acquire() as conn:
                    # A pool connection proxy behaves as the connection it wraps.
                    role = await server_role(cast(asyncpg.Connection, conn))
                    body.node, body.database = role.node, role.primary
                    status = await migrate.status(cast(asyncpg.Connection, conn))
                    body.schema_current = status.current
            if not body.database:
                body.detail = f"database {body.node} is a standby (in recovery), not the primary"
            elif not body.schema_current:
                body.detail = "schema is not current (run `respool db migrate`)"
        except Exception as exc:  # any failure means "not ready", never a 500
            body.detail = f"database unreachable: {type(exc).__name__}"
        body.listener = notifier(state).healthy
        if body.detail is None and not body.listener:
            body.detail = "notification listener is down"
        body.ready = body.database and body.schema_current and body.listener
        return Response(body, status_code=200 if body.ready else 503)
