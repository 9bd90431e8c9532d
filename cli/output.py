"""The one renderer: data goes to stdout as a table (rich), JSON or YAML; messages to stderr."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import typer
import yaml
from rich.console import Console, RenderableType
from rich.measure import Measurement

from cli.fit import show_wide
from cli.options import OutputFormat

__all__ = [
    "console",
    "emit",
    "fits_terminal",
    "note",
    "print_parts",
    "print_trimmed",
    "to_json",
    "to_yaml",
]

_WIDE = 10_000

_json = msgspec.json.Encoder(decimal_format="number")


def console(*, stderr: bool = False) -> Console:
    """A rich console on the current stdout (or stderr)."""
    return Console(stderr=stderr, highlight=False, soft_wrap=False)


# Spaces at the end of a line, before any style codes that close it.
_TRAILING = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$", re.MULTILINE)


def _trim(text: str) -> str:
    """``text`` without spaces at the ends of its lines (style codes kept)."""
    while True:
        trimmed = _TRAILING.sub(r"\1", text)
        if trimmed == text:
            return text
        text = trimmed


def print_trimmed(out: Console, part: RenderableType) -> None:
    """Print ``part`` with no spaces at the ends of its lines: rich pads every cell of a table
    to its column's width, which a pipe or a file would keep (and ``diff`` would show)."""
    with out.capture() as captured:
        out.print(part)
    out.file.write(_trim(captured.get()))
    out.file.flush()


def fits_terminal() -> bool:
    """Whether tables are fitted to a known width: a terminal's, or the ``COLUMNS`` given.
    Elsewhere (a pipe, a file) rows are printed whole, as kubectl does."""
    return sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit()


def print_parts(out: Console, parts: Iterable[RenderableType]) -> None:
    """Print each part at its natural width, never squeezed below it: rows stay whole, on
    one line each (like kubectl), however narrow the terminal or pipe."""
    base = out.width
    for part in parts:
        natural = Measurement.get(out, out.options.update(max_width=_WIDE), part).maximum
        out.width = max(base, natural)
        print_trimmed(out, part)
    out.width = base


def to_json(value: Any) -> str:
    return msgspec.json.format(_json.encode(value), indent=2).decode()


def to_yaml(value: Any) -> str:
    return yaml.safe_dump(
        msgspec.to_builtins(value), sort_keys=False, allow_unicode=True, default_flow_style=False
    )


def emit(
    value: Any,
    fmt: OutputFormat,
    table: Callable[[], Iterable[RenderableType]],
) -> None:
    """Write ``value`` in ``fmt``; ``table`` builds the human view of the same data."""
    if fmt is OutputFormat.json:
        typer.echo(to_json(value))
    elif fmt is OutputFormat.yaml:
        typer.echo(to_yaml(value), nl=False)
    else:
        with show_wide(fmt is OutputFormat.wide):
            parts = list(table())
        if fmt is OutputFormat.table and fits_terminal():
            out = console()
            for part in parts:
                print_trimmed(out, part)
        else:
            print_parts(console(), parts)
    sys.stdout.flush()


def note(message: str) -> None:
    """A message for people (stderr), never mixed with data."""
    typer.echo(message, err=True)
