"""The ETA of a waiting slice (docs/placement.md, "Sharing a GPU"; docs/scheduling.md, ETA): a
slice waits for one device with room, not for the node's summed free memory, so its estimate is
the end of the holder that frees such a device.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg
from test_shared_devices import CLOCK0, Env


async def create(conn: asyncpg.Connection, memory_mb: int, at: datetime) -> dict[str, Any]:
    body = {"subject": "s", "pool": "gpus", "resources": {"gpu_memory_mb": memory_mb}}
    doc: dict[str, Any] = await conn.fetchval(
        "SELECT request FROM respool.create_request($1, p_now => $2)", body, at
    )
    return doc


async def release(conn: asyncpg.Connection, doc: dict[str, Any], at: datetime) -> None:
    await conn.fetchval("SELECT respool.release_request(p_id => $1, p_now => $2)", doc["id"], at)


async def test_a_slice_waiting_for_a_device_gets_the_eta_of_the_holder_that_frees_one(
    conn: asyncpg.Connection,
) -> None:
    env = Env(conn)
    await env.pool()
    await env.node("n1", ["0", "1"], memory=40000)
    start = CLOCK0 + timedelta(hours=1)
    for i in range(10):  # ten recorded holds of 100 s
        done = await create(conn, 1000, start + timedelta(seconds=200 * i))
        await release(conn, done, start + timedelta(seconds=200 * i + 100))
    now = start + timedelta(hours=2)
    first = await create(conn, 25000, now - timedelta(seconds=30))
    second = await create(conn, 25000, now - timedelta(seconds=29))
    assert [first["status"], second["status"]] == ["allocated", "allocated"]
    # 30,000 MiB free on the node, 15,000 on each device: the 20,000 slice waits for a device
    waiting = await create(conn, 20000, now - timedelta(seconds=5))
    assert waiting["status"] == "queued"
    eta = await conn.fetchval("SELECT respool._request_eta($1, $2)", waiting["id"], now)
    # the first holder has run 30 s of a typical 100 s hold: about 70 s left at the median
    assert eta is not None and 60 <= eta["p50_seconds"] <= 75, eta
    assert eta["p90_seconds"] >= eta["p50_seconds"]
