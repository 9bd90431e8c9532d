"""``respool`` command: one Typer sub-app per noun (pool, node, request, token, db), plus apply,
export, serve and reconcile."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import version

import typer

from cli import db, node, pool, request, token
from cli.apply import apply, export
from cli.common import KNOWN_ERRORS, describe_error, exit_code_of
from cli.group import RespoolGroup
from cli.jobs import agent, jobs, logs
from cli.options import Typer
from cli.reconcile import reconcile
from cli.run import run
from cli.serve import serve
from cli.submit import submit

app = Typer(
    name="respool",
    help="respool: a PostgreSQL-backed resource-pool allocator.",
    no_args_is_help=True,
    add_completion=True,
    cls=RespoolGroup,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
app.add_typer(pool.app, name="pool")
app.add_typer(node.app, name="node")
app.add_typer(request.app, name="request")
app.command("apply")(apply)
app.command("export")(export)
app.add_typer(token.app, name="token")
app.add_typer(db.app, name="db")
app.command("serve")(serve)
app.command("reconcile")(reconcile)
# The commands that take a command line of their own (after --) or pass theirs on.
PASS_ON = {"allow_extra_args": True, "ignore_unknown_options": True}
app.command("run", context_settings=PASS_ON, add_help_option=False)(run)
app.command("submit", context_settings=PASS_ON)(submit)
app.command("jobs")(jobs)
app.command("agent", context_settings=PASS_ON, add_help_option=False)(agent)
app.command("logs")(logs)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"respool {version('respool')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """respool: a PostgreSQL-backed resource-pool allocator."""


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: known errors become ``error: ...`` and exit code 1 (2 for a
    malformed value)."""
    try:
        app(args=list(argv) if argv is not None else None, prog_name="respool")
    except KNOWN_ERRORS as exc:
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        sys.exit(exit_code_of(exc))


if __name__ == "__main__":
    main()
