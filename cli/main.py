"""``respool`` command: one Typer sub-app per noun (pool, node, request, token, db), plus apply,
export, serve, reconcile and the job commands.

Each command's module is imported only when that command runs (or when a help or a completion
lists it): ``respool submit`` loads the submit module alone, so it starts quickly
(docs/benchmarks.md, "Jobs run by node agents")."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

from cli.common import KNOWN_ERRORS, describe_error, exit_code_of
from cli.group import Lazy, LazyGroup
from cli.options import Typer

# The commands that take a command line of their own (after --) or pass theirs on.
PASS_ON = {"allow_extra_args": True, "ignore_unknown_options": True}

# name -> (module, attribute, options of Typer.command); an attribute ``app`` is a sub-app.
# The order is the order of ``respool --help`` (as Typer lists them: commands, then sub-apps).
COMMANDS: dict[str, Lazy] = {
    "apply": Lazy("cli.apply", "apply"),
    "export": Lazy("cli.apply", "export"),
    "serve": Lazy("cli.serve", "serve"),
    "reconcile": Lazy("cli.reconcile", "reconcile"),
    "run": Lazy("cli.run", "run", {"context_settings": PASS_ON, "add_help_option": False}),
    "submit": Lazy("cli.submit", "submit", {"context_settings": PASS_ON}),
    "jobs": Lazy("cli.jobs", "jobs"),
    "agent": Lazy("cli.jobs", "agent", {"context_settings": PASS_ON, "add_help_option": False}),
    "logs": Lazy("cli.jobs", "logs"),
    "pool": Lazy("cli.pool", "app"),
    "node": Lazy("cli.node", "app"),
    "request": Lazy("cli.request", "app"),
    "token": Lazy("cli.token", "app"),
    "db": Lazy("cli.db", "app"),
}


class RootGroup(LazyGroup):
    lazy = COMMANDS


app = Typer(
    name="respool",
    help="respool: a PostgreSQL-backed resource-pool allocator.",
    no_args_is_help=True,
    add_completion=True,
    cls=RootGroup,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

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
