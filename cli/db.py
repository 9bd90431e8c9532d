"""``respool db ...``: schema migrations and their status."""

from __future__ import annotations

import typer

from app.db.migrate import MigrateReport, SchemaStatus, migrate, status
from cli.common import database, run_async

app = typer.Typer(help="Database schema: migrate and status.", no_args_is_help=True)


async def _migrate() -> tuple[MigrateReport, SchemaStatus]:
    async with database() as conn:
        report = await migrate(conn)
        return report, await status(conn)


async def _status() -> SchemaStatus:
    async with database() as conn:
        return await status(conn)


@app.command("migrate")
def migrate_cmd() -> None:
    """Apply pending migrations and (re-)apply changed functions and views."""
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
    """Show applied and pending migrations; exit code 1 if the schema is not current."""
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
