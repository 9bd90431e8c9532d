"""A policy's time windows on the command line (``--window``) and in tables and plans: the
compact syntax, turned into the API's window objects and back.

* weekly: ``[DAYS] HH:MM-HH:MM TIMEZONE``, e.g. ``mon-fri 09:00-17:00 Europe/Berlin`` or
  ``09:00-17:00 UTC`` (every day). DAYS is a comma list of days (``mon,wed,fri``) and ranges
  (``mon-fri``; ``fri-mon`` wraps over the weekend). A ``to`` before ``from`` crosses midnight
  (``22:00-06:00``), the same ``from`` and ``to`` is 24 hours.
* one time: ``START/END``, two ISO timestamps with a zone, e.g.
  ``2026-12-24T00:00Z/2026-12-27T00:00Z``.

The engine checks the rest (a time zone it does not know, an end before its start) and names
the field. What a window does: docs/preemption.md, "Time windows".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import msgspec
import typer
from respool_client.wire import PolicyWindow, Weekday

__all__ = ["DAYS", "WindowError", "fmt_window", "fmt_windows", "parse_window", "parse_windows"]

DAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HHMM = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]"
_WEEKLY = re.compile(
    rf"^(?:(?P<days>[a-z,-]+)\s+)?(?P<from>{_HHMM})-(?P<to>{_HHMM})\s+(?P<tz>\S+)$"
)
_EXAMPLES = (
    "a window is '[DAYS] HH:MM-HH:MM ZONE', e.g. 'mon-fri 09:00-17:00 Europe/Berlin' or"
    " '22:00-06:00 UTC', or 'START/END', e.g. '2026-12-24T00:00Z/2026-12-27T00:00Z'"
)


class WindowError(ValueError):
    """A window the command line cannot read; the message says what is wrong."""


def _day(name: str, text: str) -> int:
    if name not in DAYS:
        raise WindowError(f"{text!r}: {name!r} is not a day (mon, tue, wed, thu, fri, sat, sun)")
    return DAYS.index(name)


def _days(text: str) -> list[Weekday]:
    """``mon-fri,sun`` → ``["mon", ..., "fri", "sun"]`` (sorted mon..sun, once each)."""
    chosen: set[int] = set()
    for item in text.split(","):
        first, dash, last = item.partition("-")
        if not first or (dash and not last):
            raise WindowError(f"{text!r}: a day list is like mon,wed,fri or mon-fri")
        a = _day(first, text)
        b = _day(last, text) if dash else a
        chosen.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return [DAYS[i] for i in sorted(chosen)]


def _instant(text: str, whole: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise WindowError(f"{whole!r}: {text!r} is not an ISO timestamp") from None
    if value.tzinfo is None:
        raise WindowError(f"{whole!r}: {text!r} has no zone; add Z or an offset like +01:00")
    return value


def window_from_text(text: str) -> PolicyWindow:
    """One window in the compact syntax as the API's window object (:class:`WindowError` when
    it cannot be read)."""
    tokens = text.split()
    if len(tokens) == 1 and "/" in tokens[0]:
        start, _, end = tokens[0].partition("/")
        return PolicyWindow(start=_instant(start, text), end=_instant(end, text))
    # Days and times in any case; the time zone as written (IANA names are case-sensitive).
    spec = " ".join([*(t.lower() for t in tokens[:-1]), *tokens[-1:]])
    found = _WEEKLY.match(spec)
    if found is None and _WEEKLY.match(f"{spec} UTC"):
        raise WindowError(
            f"{text!r} has no time zone: end it with one, e.g. '{text.strip()} UTC' or"
            f" '{text.strip()} Europe/Berlin'"
        )
    if found is None:
        raise WindowError(f"{text!r} is not a window ({_EXAMPLES})")
    days = _days(found["days"]) if found["days"] else None
    return PolicyWindow(
        timezone=found["tz"],
        days=None if days is not None and len(days) == 7 else days,
        from_=found["from"],
        to=found["to"],
    )


def parse_window(text: str) -> PolicyWindow:
    """``--window``'s parser: a bad window is a usage error naming the option."""
    try:
        return window_from_text(text)
    except WindowError as exc:
        raise typer.BadParameter(str(exc), param_hint="--window") from None


def parse_windows(texts: Iterable[str]) -> list[PolicyWindow]:
    return [parse_window(t) for t in texts]


def _fmt_days(days: Sequence[str] | None) -> str:
    """``mon..fri`` → ``mon-fri``: runs of three or more days become a range, one running over
    the weekend too (``fri-mon``); every day → ``""``."""
    chosen = {DAYS.index(cast(Weekday, d)) for d in days or ()}
    if not chosen or len(chosen) == 7:
        return ""
    # Walk the week from the day after a day left out, so that a run over sun-mon stays whole.
    first = next(i for i in range(7) if i not in chosen) + 1
    order = [(first + k) % 7 for k in range(7) if (first + k) % 7 in chosen]
    if 0 in chosen and 6 not in chosen:
        order = sorted(chosen)  # no run over the weekend: the plain week order
    runs: list[list[int]] = []
    for i in order:
        if runs and i == (runs[-1][-1] + 1) % 7:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [
        f"{DAYS[r[0]]}-{DAYS[r[-1]]}" if len(r) >= 3 else ",".join(DAYS[j] for j in r) for r in runs
    ]
    return ",".join(parts)


def _fmt_instant(value: datetime) -> str:
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%MZ" if utc.second == 0 else "%Y-%m-%dT%H:%M:%SZ")


def fmt_window(window: PolicyWindow | dict[str, Any]) -> str:
    """A window (object or its JSON) in the compact syntax: ``mon-fri 09:00-17:00 Europe/Berlin``,
    ``2026-12-24T00:00Z/2026-12-27T00:00Z`` (one-time windows in UTC)."""
    w = window if isinstance(window, PolicyWindow) else msgspec.convert(window, PolicyWindow)
    if w.start is not None and w.end is not None:
        return f"{_fmt_instant(w.start)}/{_fmt_instant(w.end)}"
    days = _fmt_days(w.days)
    return " ".join(x for x in (days, f"{w.from_}-{w.to}", w.timezone or "") if x)


def fmt_windows(windows: Sequence[PolicyWindow | dict[str, Any]] | None) -> str:
    """A policy's windows for a table: ``always`` without windows, else ``; `` between them."""
    if windows is None:
        return "always"
    return "; ".join(fmt_window(w) for w in windows) or "never"
