"""The HTTP API (docs/api.md): ``create_app(settings)`` builds a Litestar application.

Nothing is read at import time. The lifespan opens the asyncpg pool (``respool-api``) and the
process's LISTEN connection (``respool-listener``, :mod:`app.notify`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, Request, Response
from litestar.logging.config import LoggingConfig
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin

from app import __version__
from app.api.apply import ApplyController
from app.api.auth import Authenticator
from app.api.batch import BatchController
from app.api.dashboard import DashboardController
from app.api.edge import EdgeGuard
from app.api.errors import ErrorBody, exception_handlers
from app.api.health import HealthController
from app.api.jobs import AgentController, JobController
from app.api.metrics import EventTally, MetricsCache, MetricsController
from app.api.nodes import NodeController
from app.api.openapi import ClosedStructSchemaPlugin, answer_options
from app.api.policies import PolicyController
from app.api.pools import PoolController
from app.api.requests import RequestController
from app.api.retention import RetentionController
from app.api.route_checks import RouteChecks
from app.db.connect import APP_API, create_pool
from app.db.dsn import resolve_database_url
from app.liveness import ServiceLiveness
from app.logs import StateChangeLog
from app.notify import Notifier
from app.reconciler import Reconciler
from app.settings import Settings

__all__ = ["MAX_BODY_BYTES", "create_app"]

log = logging.getLogger("respool.api")

# Largest request body accepted (413 above it). The biggest body is an `apply` manifest: 1 MiB
# holds thousands of pools; every other body is well under 64 KiB.
MAX_BODY_BYTES = 1024 * 1024


def _too_deep(request: Request[Any, Any, Any], _: RecursionError) -> Response[ErrorBody]:
    """A JSON body nested deeper than the decoder's recursion limit: the client's input (400),
    not a 500 with a traceback in the log."""
    log.warning("%s %s: JSON body nested too deeply", request.method, request.url.path)
    return Response(ErrorBody(400, "invalid JSON body: nested too deeply", None), status_code=400)


def create_app(
    settings: Settings, *, database_url: str | None = None, with_reconciler: bool = False
) -> Litestar:
    """The API for ``settings``; ``database_url`` overrides ``settings.database_url``.

    With neither, the embedded PostgreSQL is started at startup (``resolve_database_url``).
    ``with_reconciler`` runs the reconciler loop (:mod:`app.reconciler`) in the same process
    (``respool serve`` does, unless ``--no-reconciler``); it is ``app.state.reconciler``.
    ``settings.host`` must be the bind address: auth depends on it (:mod:`app.api.auth`);
    ``RESPOOL_AUTH=off`` on a non-loopback host raises ``SettingsError`` here.
    ``app.state.notifier`` is available before startup, so a server can call
    ``begin_shutdown()`` on SIGTERM and answer every open wait at once.
    """

    authenticator = Authenticator(settings)  # refuses auth=off on a non-loopback host

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        dsn = database_url or resolve_database_url(settings)
        pool = await create_pool(
            dsn,
            size=settings.db_pool_size,
            application_name=APP_API,
            max_pending=settings.max_pending,
        )
        notifier: Notifier = app.state.notifier
        notifier.use_dsn(dsn)
        notifier.observe(StateChangeLog())  # one log line per state change made here
        reconciler_task: asyncio.Task[None] | None = None
        liveness = ServiceLiveness(pool)
        try:
            await notifier.start()
            app.state.db = pool
            await liveness.start()  # an outage's time goes back to the leases first
            await authenticator.startup(pool)
            if with_reconciler:
                reconciler = Reconciler(
                    dsn, interval=settings.reconcile_interval, retention=settings.retention
                )
                app.state.reconciler = reconciler
                reconciler_task = asyncio.create_task(reconciler.run(), name="respool-reconciler")
            # What exists now (modules, the app, the pools) lives as long as the process: out of
            # the collector's reach, full collections during a burst of long-polls stay short.
            gc.freeze()
            yield
        finally:
            if reconciler_task is not None:
                app.state.reconciler.stop()
                reconciler_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reconciler_task
            await liveness.close()
            await notifier.close()
            for name in ("coalescer", "release_coalescer"):
                if (calls := getattr(app.state, name, None)) is not None:
                    await calls.close()  # the calls under way answered before the pool closes
            await pool.close()

    app = Litestar(
        route_handlers=[
            PoolController,
            PolicyController,
            NodeController,
            RequestController,
            JobController,
            AgentController,
            BatchController,
            HealthController,
            MetricsController,
            DashboardController,
            RetentionController,
            ApplyController,
        ],
        lifespan=[lifespan],
        middleware=[
            DefineMiddleware(
                EdgeGuard,
                auth=authenticator,
                max_waits=settings.max_waits,
                max_waits_per_token=settings.max_waits_per_token,
            ),
            RouteChecks,
        ],
        before_request=answer_options,
        exception_handlers={**exception_handlers, RecursionError: _too_deep},
        request_max_body_size=MAX_BODY_BYTES,
        plugins=[ClosedStructSchemaPlugin()],
        openapi_config=OpenAPIConfig(
            title="respool",
            version=__version__,
            path="/schema",
            render_plugins=[SwaggerRenderPlugin()],
        ),
        debug=False,
        # Litestar keeps its own logger; the root logger stays as app.logs.configure_logging set
        # it (RESPOOL_LOG_LEVEL, RESPOOL_LOG_FORMAT), where Litestar's default would replace it.
        logging_config=LoggingConfig(configure_root_logger=False),
    )
    app.state.settings = settings
    app.state.notifier = Notifier()
    app.state.event_tally = EventTally()
    app.state.metrics_cache = MetricsCache(settings.metrics_cache_seconds)
    app.state.auth = authenticator
    return app
