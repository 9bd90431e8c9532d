"""``respool reconcile [--once]``: the reconciler alone (it also runs inside ``respool serve``)."""

from __future__ import annotations

import asyncio
import signal

import typer

from app.db.connect import APP_RECONCILER, connect
from app.db.dsn import resolve_database_url
from app.logs import configure_logging
from app.reconciler import PoolPass, Reconciler, reconcile_once
from app.settings import Settings
from cli.database import handle_errors, run_async

__all__ = ["reconcile"]

_COLUMNS = ("expired", "grace_ended", "preempted", "allocated", "rejected")


def _print_passes(passes: list[PoolPass]) -> None:
    if not passes:
        typer.echo("no pools")
        return
    width = max(4, *(len(p.pool) for p in passes))
    typer.echo(f"{'pool':<{width}}  " + "  ".join(_COLUMNS))
    for p in passes:
        counts = "  ".join(f"{getattr(p, c):>{len(c)}}" for c in _COLUMNS)
        typer.echo(f"{p.pool:<{width}}  {counts}")


async def _once(dsn: str) -> list[PoolPass]:
    conn = await connect(dsn, application_name=APP_RECONCILER)
    try:
        return await reconcile_once(conn)
    finally:
        await conn.close()


async def _loop(dsn: str, settings: Settings) -> None:
    reconciler = Reconciler(
        dsn, interval=settings.reconcile_interval, retention=settings.retention, log_changes=True
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, reconciler.stop)
    await reconciler.run()


def reconcile(
    once: bool = typer.Option(
        False, "--once", help="Run one pass over every pool, print what it did, and exit."
    ),
) -> None:
    """Run the reconciler: lease expiry, shrink enforcement, preemption, allocation.

    Example: respool reconcile --once
    """
    with handle_errors():
        settings = Settings.from_env()
        dsn = resolve_database_url(settings)
    configure_logging(settings.log_level, settings.log_format)
    if once:
        _print_passes(run_async(_once(dsn)))
        return
    typer.echo(
        f"reconciler running every {settings.reconcile_interval}s (Ctrl-C to stop)", err=True
    )
    run_async(_loop(dsn, settings))
