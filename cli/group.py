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

import importlib
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import typer
from typer.core import TyperGroup

from cli.common import KNOWN_ERRORS, describe_error, exit_code_of, fail
from cli.help import tidy

__all__ = ["Lazy", "LazyGroup", "RespoolGroup"]


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


class Lazy(NamedTuple):
    """A command of a :class:`LazyGroup`: ``module``'s ``attribute``, a Typer sub-app or a
    command function, registered with ``options`` (those of ``Typer.command``)."""

    module: str
    attribute: str
    options: Mapping[str, Any] = {}


class LazyGroup(RespoolGroup):
    """A root group whose commands (:attr:`lazy`) are imported when one is first looked up: a
    command line imports only its own command's module. Listing them (``--help``, completion)
    imports them all, so that every help line is the command's own."""

    lazy: ClassVar[Mapping[str, Lazy]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.loaded: dict[str, Any] = {}
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def commands(self) -> dict[str, Any]:
        """Every command, all loaded (click's own lookups go through :meth:`get_command`)."""
        for name in self.lazy:
            self._load(name)
        return self.loaded

    @commands.setter
    def commands(self, value: dict[str, Any]) -> None:
        self.loaded = dict(value)

    def list_commands(self, ctx: Any) -> list[str]:
        return [*self.lazy, *(name for name in self.loaded if name not in self.lazy)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self.lazy:
            return self._load(cmd_name)
        return self.loaded.get(cmd_name)

    def _load(self, name: str) -> Any:
        if name not in self.loaded:
            from cli.options import Typer  # the Typer whose commands take option groups

            entry = self.lazy[name]
            target = getattr(importlib.import_module(entry.module), entry.attribute)
            holder = Typer(rich_markup_mode="rich", pretty_exceptions_enable=False)
            holder.callback()(_nothing)  # a group, even with one command
            if isinstance(target, typer.Typer):
                holder.add_typer(target, name=name)
            else:
                holder.command(name, **entry.options)(target)
            command = typer.main.get_command(holder).commands[name]  # type: ignore[attr-defined]
            tidy(command)
            self.loaded[name] = command
        return self.loaded[name]


def _nothing() -> None:
    """(the callback of the group a lazy command is built in)"""
