"""Subject globs of client tokens: ``*`` matches any run of characters, ``?`` one character,
everything else is literal (``team-a:*``).

:func:`glob_to_like` turns them into SQL LIKE patterns (for ``list_requests``) and
:func:`subject_matches` matches in Python.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["glob_to_like", "subject_matches"]


def glob_to_like(pattern: str) -> str:
    """``team-a:*`` → ``team-a:%``; LIKE's own ``%``, ``_`` and ``\\`` are escaped."""
    out = []
    for ch in pattern:
        if ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        elif ch in "%_\\":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts = [".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern]
    return re.compile("".join(parts), re.DOTALL)


def subject_matches(subject: str, patterns: Sequence[str]) -> bool:
    """Whether ``subject`` matches any of the globs (the whole subject, case-sensitive)."""
    return any(_glob_regex(p).fullmatch(subject) for p in patterns)
