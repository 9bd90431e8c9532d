"""Nodes in SQL (docs/placement.md): validations, derived pool capacity, cordon and drain,
removing a node or a device, concurrent joins."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from engine_support import mk_policy, mk_pool

from app.db import nodes as db_nodes
from app.db import pools as db_pools
from app.db.errors import BadInput, Conflict, NotFound


async def test_smoke(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "gpus", {})
    n = await db_nodes.create_node(
        conn, {"name": "n1", "pool": "gpus", "capacity": {"mcpu": 1000}, "devices": {"gpu": ["0", "1"]}}
    )
    assert n.capacity == {"gpu": 2, "mcpu": 1000}
    assert (await db_pools.get_pool(conn, "gpus")).capacity == {"gpu": 2, "mcpu": 1000}
