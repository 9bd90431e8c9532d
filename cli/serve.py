"""``respool serve``: the HTTP API and the reconciler loop in one process, or in N worker
processes on one port (``--workers``; docs/ops.md, "Workers")."""

from __future__ import annotations

import msgspec
import typer

from app.db.connect import APP_CLI, connect
from app.db.dsn import redact_dsn, resolve_database_url
from app.db.migrate import migrate
from app.logs import configure_logging
from app.settings import MAX_WORKERS, Settings
from cli.common import fail
from cli.database import handle_errors, run_async

__all__ = ["serve"]


async def _migrate(dsn: str) -> None:
    conn = await connect(dsn, application_name=APP_CLI)
    try:
        report = await migrate(conn)
    finally:
        await conn.close()
    for name in report.applied:
        typer.echo(f"applied migration {name}", err=True)


def serve(
    host: str | None = typer.Option(None, "--host", help="Bind address (RESPOOL_HOST)."),
    port: int | None = typer.Option(None, "--port", help="Port (RESPOOL_PORT, default 8080)."),
    no_reconciler: bool = typer.Option(
        False,
        "--no-reconciler",
        help="Serve the API only (run the reconciler elsewhere, e.g. `respool reconcile`).",
    ),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        max=MAX_WORKERS,
        help="API processes on the port (RESPOOL_WORKERS, default 1); one reconciler for all.",
    ),
) -> None:
    """Run the HTTP API and the reconciler. Migrates the database first (RESPOOL_DATABASE_URL,
    else the embedded PostgreSQL).

    Example:

        respool serve --port 8080

        respool serve --workers 4
    """
    # Imported here so that other commands do not pay for the web stack.
    from app.api import create_app
    from app.api.auth import check_auth_settings
    from app.api.server import ApiServer, bind_listener, serve_workers, uvicorn_config

    with handle_errors():
        settings = Settings.from_env()
        if host:
            settings = msgspec.structs.replace(settings, host=host)
        if port:
            settings = msgspec.structs.replace(settings, port=port)
        if workers:
            settings = msgspec.structs.replace(settings, workers=workers)
        check_auth_settings(settings)  # before touching the database
    # The port first: one in use is one line, before anything is started or said to listen.
    try:
        sock = bind_listener(settings.host, settings.port)
    except OSError as exc:
        fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}")
    sock.set_inheritable(False)  # not by the PostgreSQL an embedded database starts
    listening = f"http://{settings.host}:{sock.getsockname()[1]}"  # (--port 0: the one chosen)
    with handle_errors():
        dsn = resolve_database_url(settings)
    run_async(_migrate(dsn))
    configure_logging(settings.log_level, settings.log_format)
    if settings.workers > 1:
        typer.echo(
            f"respool API on {listening} with {settings.workers} "
            f"workers (database {redact_dsn(dsn)})",
            err=True,
        )
        sock.set_inheritable(True)  # the workers' own
        with handle_errors():
            status = serve_workers(
                settings, dsn, sock, workers=settings.workers, with_reconciler=not no_reconciler
            )
        raise typer.Exit(status)
    with handle_errors():
        app = create_app(settings, database_url=dsn, with_reconciler=not no_reconciler)
    config = uvicorn_config(
        app,
        settings,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # configure_logging already routes uvicorn's loggers
    )
    typer.echo(
        f"respool API on {listening} (database {redact_dsn(dsn)})",
        err=True,
    )
    ApiServer(config, app).run(sockets=[sock])
