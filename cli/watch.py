"""``--watch SECONDS``: draw a view again every few seconds until Ctrl-C, as ``watch`` does."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from time import sleep
from typing import Annotated

import typer
from rich.text import Text

from cli.options import OutputFormat
from cli.output import console

__all__ = ["Watch", "watch"]

Watch = Annotated[
    float | None,
    typer.Option(
        "--watch",
        "-w",
        min=0.5,
        metavar="SECONDS",
        show_default=False,
        help="Draw the table again every SECONDS until Ctrl-C.",
    ),
]


def watch(every: float | None, output: OutputFormat, draw: Callable[[], None]) -> None:
    """``draw()`` once; with ``every``, again every ``every`` seconds until Ctrl-C (exit 0).

    On a terminal the screen is cleared before each drawing; elsewhere the drawings follow one
    another, each under a line with the time."""
    if every is None:
        draw()
        return
    if output not in (OutputFormat.table, OutputFormat.wide):
        raise typer.BadParameter("redraws a table: leave out -o json/yaml", param_hint="--watch")
    out = console()
    try:
        while True:
            if out.is_terminal:
                out.clear()
            now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            out.print(Text(f"Every {every:g}s, {now} (Ctrl-C to stop)", style="dim"))
            draw()
            sleep(every)
    except KeyboardInterrupt:
        out.print()
