"""Named SQL queries: every statement Python runs, kept in ``sql/queries/*.sql``.

A file holds blocks like this (procrastinate's ``queries.sql`` layout)::

    -- create_pool --
    -- Create a pool; returns its row.
    SELECT * FROM respool.create_pool(p_name => $1, p_capacity => $2);

The header line ``-- name --`` starts a block; the comment lines right after it describe the
query; everything up to the next header is the statement. Names are unique across all files.
The files are read once, on first use, from the same place as the migrations
(:func:`app.db.sqlfiles.sql_dir`), so they ship in the wheel.
"""

from __future__ import annotations

import re
from functools import cache

from app.db.sqlfiles import sql_dir

__all__ = ["query", "query_names"]

_HEADER = re.compile(r"^--\s*([a-z][a-z0-9_]*)\s*--\s*$", re.MULTILINE)


def parse(text: str, source: str = "<string>") -> dict[str, str]:
    """The ``name → statement`` blocks of one file (comment lines stripped from each)."""
    blocks: dict[str, str] = {}
    headers = list(_HEADER.finditer(text))
    for here, after in zip(headers, [*headers[1:], None], strict=True):
        name = here.group(1)
        body = text[here.end() : after.start() if after else len(text)]
        statement = "\n".join(
            line for line in body.splitlines() if not line.lstrip().startswith("--")
        ).strip()
        if not statement:
            raise ValueError(f"{source}: query {name!r} has no statement")
        if name in blocks:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        blocks[name] = statement
    return blocks


@cache
def _all() -> dict[str, str]:
    everything: dict[str, str] = {}
    folder = sql_dir() / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, statement in parse(entry.read_text(encoding="utf-8"), entry.name).items():
            if name in everything:
                raise ValueError(f"{entry.name}: query {name!r} is also defined in another file")
            everything[name] = statement
    return everything


def query(name: str) -> str:
    """The statement named ``name`` (``KeyError`` naming it when there is none)."""
    try:
        return _all()[name]
    except KeyError:
        raise KeyError(f"no SQL query named {name!r} in sql/queries") from None


def query_names() -> frozenset[str]:
    """Every defined query name (for tests that check each one is used and valid)."""
    return frozenset(_all())
