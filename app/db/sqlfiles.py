"""Locating the SQL files, both in an installed wheel (``app/sql``) and in a source checkout."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = ["sql_dir"]

_REPO_SQL = Path(__file__).resolve().parents[2] / "sql"


def sql_dir() -> Traversable | Path:
    """The directory holding ``migrations/``, ``functions/`` and ``views/``.

    A built wheel carries it as package data at ``app/sql``; an editable install or a source
    checkout uses the repository's top-level ``sql/``.
    """
    packaged = files("app") / "sql"
    if packaged.is_dir():
        return packaged
    return _REPO_SQL
