"""The root command group: every failure ends as one ``error: ...`` line on stderr.

* usage errors (bad option, missing argument): exit code 2, with a pointer to ``--help``;
* known errors (:data:`cli.common.KNOWN_ERRORS`: API answers, an unreachable API, unreadable
  files; the database commands report theirs the same way, through
  :func:`cli.database.handle_errors`): exit code 1, or 2 for a malformed value the user typed
  (:class:`cli.common.BadValue`);
* anything else is a bug, reported on one line too (exit code 1); the traceback is printed only
  with ``RESPOOL_LOG_LEVEL=DEBUG``.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from cli.common import KNOWN_ERRORS, describe_error, exit_code_of, fail
from cli.help import tidy

__all__ = ["RespoolGroup"]


def _usage_hint(exc: typer.TyperException) -> str:
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None)
    return f" (see '{path} --help')" if exc.exit_code == 2 and path else ""


class RespoolGroup(TyperGroup):
    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        tidy(self)
        try:
            rv = super().main(
                args,
                prog_name,
                complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        except typer.TyperException as exc:  # click's ClickException, UsageError, BadParameter
            message = " ".join(exc.format_message().split())
            typer.echo(f"error: {message}{_usage_hint(exc)}", err=True)
            rv = exc.exit_code
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            rv = 1
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except KNOWN_ERRORS as exc:
            fail(describe_error(exc), exit_code_of(exc))
        except Exception as exc:
            if os.environ.get("RESPOOL_LOG_LEVEL", "").strip().upper() == "DEBUG":
                traceback.print_exc()
            fail(f"internal error ({type(exc).__name__}: {exc}); this is a bug, please report it")
