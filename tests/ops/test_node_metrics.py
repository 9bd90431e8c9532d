"""``/metrics`` per node (docs/placement.md, views and metrics; docs/ops.md): capacity,
allocated and free per node and key, one state gauge per node and state, and the node
invariants I5-I7 counted like I1-I4. Scraped from a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from support.db import direct
from support.server import Server, running_server

from .test_metrics import get, scrape


async def _node(conn: asyncpg.Connection, body: dict[str, Any]) -> None:
    await conn.execute("SELECT respool.create_node($1)", body)


async def _gpus(conn: asyncpg.Connection, n: int) -> dict[str, Any]:
    made: dict[str, Any] = await conn.fetchval(
        "SELECT (respool.create_request($1)).request",
        {"subject": "S", "pool": "box", "resources": {"gpu": n}},
    )
    return made


@pytest.fixture
async def srv(db_url: str) -> AsyncIterator[tuple[Server, asyncpg.Connection]]:
    """Pool ``box`` backed by node box1 (8 named gpus, 64000 mcpu) and box2 (cordoned, 4
    anonymous gpus); node ``spare`` (2 gpus) is in no pool, node ``bare`` has no capacity.
    Two 4-GPU requests hold box1; a third waits."""
    async with (
        direct(db_url) as conn,
        running_server(db_url, metrics_cache_seconds=0.0) as server,
    ):
        await conn.execute("SELECT respool.create_pool(p_name => 'box')")
        await conn.execute("SELECT respool.create_policy(p_subject => 'S', p_pool => 'box')")
        eight = [str(i) for i in range(8)]
        await _node(conn, {"name": "box1", "pool": "box", "capacity": {"gpu": 8, "mcpu": 64000},
                           "devices": {"gpu": eight}})  # fmt: skip
        await _node(conn, {"name": "box2", "pool": "box", "capacity": {"gpu": 4},
                           "state": "cordoned"})  # fmt: skip
        await _node(conn, {"name": "spare", "capacity": {"gpu": 2}})
        await _node(conn, {"name": "bare"})
        assert [(await _gpus(conn, 4))["status"] for _ in range(3)] == [
            "allocated", "allocated", "queued",
        ]  # fmt: skip
        yield server, conn


async def test_node_gauges_per_node_and_key(srv: tuple[Server, asyncpg.Connection]) -> None:
    m = await scrape(srv[0])
    box1 = {"pool": "box", "node": "box1", "key": "gpu"}
    assert get(m, "respool_node_capacity", **box1) == 8
    assert get(m, "respool_node_allocated", **box1) == 8
    assert get(m, "respool_node_free", **box1) == 0
    assert get(m, "respool_node_capacity", pool="box", node="box1", key="mcpu") == 64000
    assert get(m, "respool_node_allocated", pool="box", node="box1", key="mcpu") == 0
    box2 = {"pool": "box", "node": "box2", "key": "gpu"}
    assert (get(m, "respool_node_capacity", **box2), get(m, "respool_node_allocated", **box2)) == (
        4,
        0,
    )
    # A node in no pool has pool="": it is registered and counted nowhere.
    assert get(m, "respool_node_capacity", pool="", node="spare", key="gpu") == 2
    # The pool's own gauges are the nodes' sums (box2 counts although cordoned).
    assert get(m, "respool_pool_capacity", pool="box", key="gpu") == 12
    assert get(m, "respool_pool_allocated", pool="box", key="gpu") == 8
    assert get(m, "respool_queue_length", pool="box") == 1
    # A node with no capacity has no per-key sample at all.
    assert not [
        k for k in m if k[0].startswith("respool_node_capacity") and ("node", "bare") in k[1]
    ]


async def test_node_state_gauge_is_one_for_the_current_state(
    srv: tuple[Server, asyncpg.Connection],
) -> None:
    server, conn = srv
    m = await scrape(server)
    expected = {
        ("box", "box1"): "active", ("box", "box2"): "cordoned", ("", "spare"): "active",
        ("", "bare"): "active",
    }  # fmt: skip
    for (pool, node), current in expected.items():
        for state in ("active", "cordoned", "draining"):
            want = 1 if state == current else 0
            assert get(m, "respool_node_state", pool=pool, node=node, state=state) == want, (
                node,
                state,
            )
    await conn.execute("SELECT respool.set_node_state('box1', 'draining')")
    m = await scrape(server)
    assert get(m, "respool_node_state", pool="box", node="box1", state="draining") == 1
    assert get(m, "respool_node_state", pool="box", node="box1", state="active") == 0


async def test_node_invariants_are_counted(srv: tuple[Server, asyncpg.Connection]) -> None:
    server, conn = srv
    m = await scrape(server)
    for inv in ("I1", "I2", "I3", "I4", "I5", "I6", "I7"):
        assert get(m, "respool_invariant_violations", invariant=inv) == 0, inv
    # Break the books by hand: box1's mcpu counter says 5 units are held (none are), and one
    # gpu device loses its holder.
    await conn.execute(
        "UPDATE respool.node_resources SET used = 5 WHERE key = 'mcpu'"
        " AND node_id = (SELECT id FROM respool.nodes WHERE name = 'box1')"
    )
    await conn.execute(
        "UPDATE respool.node_devices SET holder_id = NULL WHERE device = '0'"
        " AND node_id = (SELECT id FROM respool.nodes WHERE name = 'box1')"
    )
    m = await scrape(server)
    assert get(m, "respool_invariant_violations", invariant="I4") == 1
    assert get(m, "respool_invariant_violations", invariant="I6") == 1
    assert get(m, "respool_invariant_violations", invariant="I5") == 0
    assert get(m, "respool_node_allocated", pool="box", node="box1", key="mcpu") == 5


async def test_shared_device_gauges(srv: tuple[Server, asyncpg.Connection]) -> None:
    """Per shared device: the memory it offers to slices, what its slices hold, how many."""
    server, conn = srv
    await conn.execute("SELECT respool.create_pool(p_name => 'nb')")
    await conn.execute("SELECT respool.create_policy(p_subject => 'S', p_pool => 'nb')")
    await _node(conn, {"name": "nb1", "pool": "nb", "devices": {"gpu": ["0", "1"]},
                       "sharing": {"gpu": "mps"}, "device_memory_mb": {"gpu": 81920},
                       "reserved_memory_mb": {"gpu": 512}})  # fmt: skip
    placed = []
    for memory, share in ((20480, 50), (10240, None)):
        resources = {"gpu_memory_mb": memory} | ({"gpu_share": share} if share else {})
        made = await conn.fetchval(
            "SELECT (respool.create_request($1)).request",
            {"subject": "S", "pool": "nb", "resources": resources},
        )
        assert made["status"] == "allocated"
        placed.append(made["placement"]["devices"]["gpu"][0])
    assert placed[0] == placed[1]  # pack: the second slice joins the first
    sliced, spare = placed[0], "1" if placed[0] == "0" else "0"
    m = await scrape(server)
    for device, used, holders in ((sliced, 30720, 2), (spare, 0, 0)):
        labels = {"pool": "nb", "node": "nb1", "key": "gpu", "device": device}
        assert get(m, "respool_device_memory_offered_mb", **labels) == 81408
        assert get(m, "respool_device_memory_sliced_mb", **labels) == used
        assert get(m, "respool_device_slice_holders", **labels) == holders
    # devices handed out whole only (box1) have no device series
    assert not [k for k in m if k[0].startswith("respool_device_") and ("node", "box1") in k[1]]
