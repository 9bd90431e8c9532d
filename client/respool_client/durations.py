"""Parsing of human durations such as ``7d``, ``12h``, ``30m``, ``90s`` or ``1h30m``."""

from __future__ import annotations

import math
import re

__all__ = ["parse_duration", "format_duration"]

_UNITS: dict[str, float] = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)([smhdw])")
_WHOLE = re.compile(r"(?:(?:\d+(?:\.\d+)?|\.\d+)[smhdw])+")


def parse_duration(text: str) -> float:
    """Return the number of seconds in ``text``.

    Accepts a plain number of seconds (``"90"``, ``"1.5"``) or one or more number+unit parts,
    units being s, m, h, d, w (``"7d"``, ``"1h30m"``). Raises ValueError on anything else,
    including negative, infinite or NaN values.
    """
    s = text.strip().lower()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        if not _WHOLE.fullmatch(s):
            raise ValueError(
                f"invalid duration {text!r} (use e.g. 90s, 30m, 12h, 7d or seconds)"
            ) from None
        value = sum(float(n) * _UNITS[u] for n, u in _PART.findall(s))
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"invalid duration {text!r} (must be a finite, non-negative amount)")
    return value


def format_duration(seconds: float) -> str:
    """Render seconds compactly (``86400`` -> ``"1d"``, ``5400`` -> ``"1h30m"``)."""
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"cannot format {seconds!r}")
    whole = int(seconds)
    if whole != seconds or whole == 0:
        return f"{seconds:g}s"
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        size = int(_UNITS[unit])
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
