"""``respool db ...``: schema migrations and their status, ``grant-reader``, and the way in for
ops: ``url`` (the DSN the service uses) and ``shell`` (psql on it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import Annotated

import typer
from respool_client.durations import parse_duration
from respool_client.wire import INT32_MAX

from app.db import ops as db_ops
from app.db.dsn import redact_dsn, split_password
from app.db.errors import EngineError
from app.db.migrate import MigrateReport, SchemaStatus, migrate, status
from cli.common import CliError, fail
from cli.database import database, database_url, handle_errors, run_async

app = typer.Typer(
    help="Database schema: migrate and status; the ops reader role; its URL and a psql shell.",
    no_args_is_help=True,
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
    """Let ROLE read the ops views of this database.

    SELECT on the views only, read-only transactions by default and a statement timeout.
    Needs a superuser or CREATEROLE connection (RESPOOL_DATABASE_URL).

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


@app.command("url")
def url_cmd(
    show_password: bool = typer.Option(
        False, "--show-password", help="Print the password as it is (default: ***)."
    ),
) -> None:
    """Print the URL of the database the service uses.

    That is RESPOOL_DATABASE_URL, else the embedded server's. An embedded server that is not
    running is started, as `respool serve` would, and keeps running so that the URL works
    (the next `respool serve` stops it when it exits).

    Example:

        psql "$(respool db url --show-password)"
    """
    with handle_errors():
        url = database_url(keep_running=True)
    typer.echo(url if show_password else redact_dsn(url))


@app.command("shell")
def shell_cmd(
    psql_args: Annotated[
        list[str] | None,
        typer.Argument(metavar="PSQL_ARGS", help="Options and arguments for psql, after --."),
    ] = None,
) -> None:
    """Run psql on the database the service uses.

    The URL is `respool db url`'s; a password goes to psql in PGPASSWORD, not on its command
    line. An embedded server this starts stops when psql exits, unless another process uses
    it. Exits with psql's code.

    Example:

        respool db shell -- -c 'SELECT * FROM respool.pool_usage'
    """
    psql = shutil.which("psql")
    with handle_errors():
        url = database_url(keep_running=psql is None)
    if psql is None:
        shown = redact_dsn(url)
        whole = "" if shown == url else " (`respool db url --show-password` prints it whole)"
        fail(f"psql is not on PATH: install the PostgreSQL client, or connect any client to "
             f"{shown}{whole}")  # fmt: skip
    raise typer.Exit(_run_psql(psql, url, psql_args or []))


def _leave(sig: int, _frame: object) -> None:
    raise SystemExit(128 + sig)


def _run_psql(psql: str, url: str, args: list[str]) -> int:
    """psql's exit code. Ctrl-C is psql's to handle (it cancels the running query), so this
    process waits through it. A closed terminal (SIGHUP) or a kill (SIGTERM) ends this process
    the orderly way: psql is killed and waited for, and an embedded server started for it
    stops (exit 128 + the signal)."""
    dsn, password = split_password(url)
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = password
    ours = {signal.SIGINT: lambda *_: None, signal.SIGHUP: _leave, signal.SIGTERM: _leave}
    previous = {sig: signal.signal(sig, handler) for sig, handler in ours.items()}
    try:
        return subprocess.run([psql, "--dbname", dsn, *args], env=env, check=False).returncode
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
