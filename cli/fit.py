"""Tables that fit the width they are drawn in, as kubectl's do.

A :class:`FitTable` is laid out when rich draws it: the columns marked ``drop`` go first (the
lowest ``drop`` first) while the table cannot fit even with its ``shrink`` columns cut down,
then rich narrows the ``shrink`` columns, widest first, and cuts their cells with an ellipsis.
Every row stays on one line. Columns marked ``wide`` are shown only in ``-o wide``, where
every column is shown at its natural width."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

__all__ = ["Col", "FitTable", "show_wide"]

# A shrinking column is never cut below this many characters before columns are dropped.
SHRINK_FLOOR = 14
_NATURAL = 10_000

_wide: ContextVar[bool] = ContextVar("respool_wide_output", default=False)


@contextmanager
def show_wide(on: bool) -> Iterator[None]:
    """While active, the tables built show every column (``-o wide``)."""
    token = _wide.set(on)
    try:
        yield
    finally:
        _wide.reset(token)


@dataclass(frozen=True)
class Col:
    """A column: ``drop`` n > 0 is the n-th to go when the table is too wide (0: always shown);
    ``shrink``: its cells may be cut with an ellipsis; ``wide``: only in ``-o wide``."""

    header: str
    drop: int = 0
    shrink: bool = False
    wide: bool = False


def _cell(value: RenderableType) -> RenderableType:
    """A cell that stays on one line and ends in an ellipsis when cut."""
    if isinstance(value, str):
        return Text(value, no_wrap=True, overflow="ellipsis")
    if isinstance(value, Text):
        value.no_wrap, value.overflow = True, "ellipsis"
    return value


class FitTable:
    """A borderless table in the house style (bold left-aligned title) that fits its width."""

    def __init__(self, *cols: Col | str, title: str | None = None) -> None:
        specs = [Col(c) if isinstance(c, str) else c for c in cols]
        self.wide = _wide.get()
        # (index in a row, column) of the columns this output shows
        self.cols = [(i, c) for i, c in enumerate(specs) if self.wide or not c.wide]
        self.rows: list[tuple[RenderableType, ...]] = []
        self.title = title

    def add_row(self, *cells: RenderableType) -> None:
        """One row, a cell per column given to the constructor (``wide`` ones included)."""
        self.rows.append(tuple(cells))

    def _build(self, shown: Sequence[tuple[int, Col]], floor: bool = False) -> Table:
        columns = [
            Column(
                c.header,
                no_wrap=not c.shrink,
                overflow="ellipsis",
                max_width=SHRINK_FLOOR if floor and c.shrink else None,
            )
            for _, c in shown
        ]
        out = Table(
            *columns,
            box=box.SIMPLE_HEAD,
            show_edge=False,
            title=self.title,
            title_justify="left",
            title_style="bold",
        )
        for row in self.rows:
            out.add_row(*(_cell(row[i]) for i, _ in shown))
        return out

    def layout(self, console: Console, width: int) -> Table:
        """The table for ``width``: low-value columns dropped while even the shrunk table
        would not fit (never in ``-o wide``)."""
        shown = list(self.cols)
        if not self.wide:
            for col in sorted((c for c in self.cols if c[1].drop), key=lambda c: c[1].drop):
                if _natural(console, self._build(shown, floor=True)) <= width:
                    break
                shown.remove(col)
        return self._build(shown)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.layout(console, options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.layout(console, options.max_width))


def _natural(console: Console, table: Table) -> int:
    return Measurement.get(console, console.options.update(max_width=_NATURAL), table).maximum
