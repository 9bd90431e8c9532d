"""``respool db ...``: schema migrations and their status, and ``grant-reader`` for ops."""

from __future__ import annotations

import typer
from respool_client.durations import parse_duration
from respool_client.wire import INT32_MAX

from app.db import ops as db_ops
from app.db.errors import EngineError
from app.db.migrate import MigrateReport, SchemaStatus, migrate, status
from cli.common import CliError, fail
from cli.database import database, run_async

app = typer.Typer(
    help="Database schema: migrate and status; the ops reader role.", no_args_is_help=True
)


async def _migrate() -> tuple[MigrateReport, SchemaStatus]:
    async with database() as conn:
        report = await migrate(conn)
        return report, await status(conn)


async def _status() -> SchemaStatus:
    async with database() as conn:
        return await status(conn)


@app.command("migrate")
def migrate_cmd() -> None:
    """Apply pending migrations and (re-)apply changed functions and views.

    Example:

        RESPOOL_DATABASE_URL=postgresql://respool@db/respool respool db migrate
    """
    report, state = run_async(_migrate())
    for name in report.applied:
        typer.echo(f"applied     {name}")
    if not report.applied:
        typer.echo("migrations  nothing to apply")
    if report.repeatables_applied:
        typer.echo(f"repeatables re-applied ({len(report.repeatables)} files)")
    else:
        typer.echo("repeatables unchanged")
    typer.echo(
        f"schema      {'current' if state.current else 'NOT current'} "
        f"({len(state.applied)} migrations applied)"
    )


@app.command("status")
def status_cmd() -> None:
    """Show applied and pending migrations; exit code 1 if the schema is not current.

    Example:

        respool db status
    """
    state = run_async(_status())
    typer.echo(f"migrations: {len(state.applied)} applied, {len(state.pending)} pending")
    for name in state.applied:
        flag = "CHANGED " if name in state.mismatched else "applied "
        flag = "MISSING " if name in state.missing else flag
        typer.echo(f"  {flag} {name}")
    for name in state.pending:
        typer.echo(f"  pending  {name}")
    if state.repeatables_stale:
        typer.echo("repeatables: stale")
        for path in state.repeatables_stale:
            typer.echo(f"  stale    {path}")
    else:
        typer.echo("repeatables: up to date")
    if state.mismatched:
        typer.echo("checksum mismatch: " + ", ".join(state.mismatched))
    if state.missing:
        typer.echo("applied but missing: " + ", ".join(state.missing))
    if state.current:
        typer.echo("schema: current")
    else:
        typer.echo("schema: NOT current (run `respool db migrate`)")
        raise typer.Exit(1)


async def _grant_reader(role: str, timeout_ms: int, create: bool, revoke: bool) -> str:
    async with database() as conn:
        try:
            if revoke:
                return await db_ops.revoke_reader(conn, role)
            return await db_ops.grant_reader(
                conn, role, statement_timeout_ms=timeout_ms, create=create
            )
        except EngineError as exc:
            raise CliError(exc.message) from None


@app.command("grant-reader")
def grant_reader_cmd(
    role: str = typer.Argument(..., help="A PostgreSQL login role (created with --create)."),
    statement_timeout: str = typer.Option(
        "30s", "--statement-timeout", help="Per-statement time limit for ROLE, e.g. 30s, 2m."
    ),
    create: bool = typer.Option(False, "--create", help="Create ROLE (LOGIN, no password)."),
    revoke: bool = typer.Option(False, "--revoke", help="Undo: revoke and reset the settings."),
) -> None:
    """Let ROLE read the ops views (respool_reader): SELECT on views only, read-only
    transactions by default and a statement timeout, in this database. Needs a superuser or
    CREATEROLE connection (RESPOOL_DATABASE_URL).

    Example:

        respool db grant-reader grafana --create --statement-timeout 10s
    """
    try:
        timeout_ms = round(parse_duration(statement_timeout) * 1000)
    except ValueError as exc:
        fail(f"--statement-timeout: {exc}")
    if timeout_ms < 1 or timeout_ms > INT32_MAX:
        fail("--statement-timeout: must be between 1ms and about 24 days")
    typer.echo(run_async(_grant_reader(role, timeout_ms, create, revoke)))
