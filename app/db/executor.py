"""What the query modules run on, and how they read an answer.

``Executor`` is a connection or a pool: every call of :mod:`app.db` takes either. ``_as`` reads
the engine's JSON answer into one of the wire types of :mod:`respool_client.wire` (the types the
API sends and the client reads), leniently, as the engine's ``jsonb`` gives it.
"""

from __future__ import annotations

from typing import Any, TypeVar

import asyncpg
import msgspec

from app.db.named import query

Executor = asyncpg.Connection | asyncpg.Pool

T = TypeVar("T")


def _as(kind: type[T], doc: Any) -> T:
    return msgspec.convert(doc, kind, strict=False)


async def fetch_as(db: Executor, kind: type[T], name: str, *args: Any) -> T:
    """The one value the named query ``name`` answers (the engine's JSON), read as ``kind``."""
    return _as(kind, await db.fetchval(query(name), *args))
