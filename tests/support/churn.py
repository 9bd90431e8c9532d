"""A worker that creates, releases and cancels requests at random on a connection of its own."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from app.db.connect import APP_CLI, connect

__all__ = ["churn"]


async def churn(
    db_url: str,
    seed: int,
    body: Callable[[random.Random], dict[str, Any]],
    after: Callable[[asyncpg.Connection, dict[str, Any]], Awaitable[None]],
    *,
    cancel_at_end: bool,
    steps: int = 40,
) -> None:
    """``steps`` times: end one of its requests (45 % once it has any: release if allocated,
    else cancel; one granted meanwhile by another worker's release is cancelled, which ends a
    holding too) or create ``body(rng)`` and hand the answer to ``after``. With
    ``cancel_at_end``, it cancels whatever it still has."""
    rng = random.Random(seed)
    c = await connect(db_url, application_name=APP_CLI)
    mine: list[Any] = []
    try:
        for _ in range(steps):
            if mine and rng.random() < 0.45:
                rid = mine.pop(rng.randrange(len(mine)))
                status = await c.fetchval("SELECT status FROM respool.requests WHERE id = $1", rid)
                action = "release_request" if status == "allocated" else "cancel_request"
                await c.fetchval(f"SELECT respool.{action}(p_id => $1)", rid)
                continue
            doc = await c.fetchval("SELECT request FROM respool.create_request($1)", body(rng))
            if doc["status"] in ("allocated", "queued"):
                mine.append(doc["id"])
            await after(c, doc)
        if cancel_at_end:
            for rid in mine:
                await c.fetchval("SELECT respool.cancel_request(p_id => $1)", rid)
    finally:
        await c.close()
