"""The node views (sql/views/030_nodes.sql) and the node invariants I4-I7 of
``respool.invariant_violations`` (docs/placement.md, invariants; docs/ops.md).

The state is written with plain SQL as a superuser, row by row, so that each test can break
exactly one fact and see exactly the row that names it. The requests are granted before any
node exists (so the engine grants them without a placement) and then placed by hand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from support.db import assert_refused, direct, reconcile

HOLDING = ("a", "b", "c")


async def _request(conn: asyncpg.Connection, pool: str, gpu: int, mcpu: int = 0) -> UUID:
    resources = {"gpu": gpu} | ({"mcpu": mcpu} if mcpu else {})
    made = await conn.fetchval(
        "SELECT (respool.create_request($1)).request",
        {"subject": "S", "pool": pool, "resources": resources},
    )
    assert made["status"] == "allocated"
    return UUID(made["id"])


async def _node(
    conn: asyncpg.Connection,
    name: str,
    pool: str | None,
    capacity: dict[str, int],
    devices: dict[str, list[str]],
    state: str = "active",
) -> UUID:
    node_id: UUID = await conn.fetchval(
        "INSERT INTO respool.nodes (name, pool_id, labels, state)"
        " VALUES ($1, (SELECT id FROM respool.pools WHERE name = $2), $3, $4) RETURNING id",
        name,
        pool,
        {"gpu-type": "A100-80G"},
        state,
    )
    for key, cap in capacity.items():
        await conn.execute(
            "INSERT INTO respool.node_resources (node_id, key, capacity, devices)"
            " VALUES ($1, $2, $3, $4)",
            node_id,
            key,
            cap,
            len(devices.get(key, [])),
        )
    for key, ids in devices.items():
        for pos, device in enumerate(ids):
            await conn.execute(
                "INSERT INTO respool.node_devices (node_id, key, device, position)"
                " VALUES ($1, $2, $3, $4)",
                node_id,
                key,
                device,
                pos,
            )
    return node_id


async def _place(
    conn: asyncpg.Connection, request: UUID, node: UUID, units: dict[str, int], devices: list[str]
) -> None:
    await conn.execute(
        "INSERT INTO respool.placements (request_id, node_id, resources) VALUES ($1, $2, $3)",
        request,
        node,
        units,
    )
    for key, n in units.items():
        await conn.execute(
            "UPDATE respool.node_resources SET used = used + $3 WHERE node_id = $1 AND key = $2",
            node,
            key,
            n,
        )
    await conn.execute(
        "UPDATE respool.node_devices SET holder_id = $1"
        " WHERE node_id = $2 AND key = 'gpu' AND device = ANY($3::text[])",
        request,
        node,
        devices,
    )


@pytest.fixture
async def ids(db_url: str) -> dict[str, UUID]:
    """A healthy placed state.

    Pool ``gpus`` (gpu 16): node n1 (active; gpu devices "0".."7", mcpu 64000) holds a
    (4 gpu on 0-3, 2000 mcpu) and b (2 gpu on 4-5); node n2 (cordoned; gpu "0".."7") holds c
    on 0-2. Node n3 is in no pool (4 anonymous gpu). Pool ``other`` has node n4. Request d was
    released.
    """
    async with direct(db_url) as conn:
        await conn.execute("SELECT respool.create_pool(p_name => 'gpus', p_capacity => $1)",
                           {"gpu": 16})  # fmt: skip
        await conn.execute("SELECT respool.create_pool(p_name => 'other', p_capacity => $1)",
                           {"gpu": 8})  # fmt: skip
        for pool in ("gpus", "other"):
            await conn.execute("SELECT respool.create_policy(p_subject => 'S', p_pool => $1)", pool)
        sizes = {"a": (4, 2000), "b": (2, 0), "c": (3, 0), "d": (1, 0)}
        out = {name: await _request(conn, "gpus", *size) for name, size in sizes.items()}
        await conn.execute("SELECT respool.release_request(p_id => $1)", out["d"])
        eight = [str(i) for i in range(8)]
        out["n1"] = await _node(conn, "n1", "gpus", {"gpu": 8, "mcpu": 64000}, {"gpu": eight})
        out["n2"] = await _node(conn, "n2", "gpus", {"gpu": 8}, {"gpu": eight}, "cordoned")
        out["n3"] = await _node(conn, "n3", None, {"gpu": 4}, {})
        out["n4"] = await _node(conn, "n4", "other", {"gpu": 8}, {})
        await _place(conn, out["a"], out["n1"], {"gpu": 4, "mcpu": 2000}, ["0", "1", "2", "3"])
        await _place(conn, out["b"], out["n1"], {"gpu": 2}, ["4", "5"])
        await _place(conn, out["c"], out["n2"], {"gpu": 3}, ["0", "1", "2"])
        return out


@pytest.fixture
async def db(db_url: str, ids: dict[str, UUID]) -> AsyncIterator[asyncpg.Connection]:
    async with direct(db_url) as conn:
        yield conn


async def violations(db: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await db.fetch(
        "SELECT invariant, pool, subject, key, detail FROM respool.invariant_violations"
        " ORDER BY invariant, detail"
    )
    return [tuple(r) for r in rows]


async def test_node_usage_is_one_row_per_node_and_key(db: asyncpg.Connection) -> None:
    rows = await db.fetch("SELECT * FROM respool.node_usage")
    assert [tuple(r) for r in rows] == [
        ("gpus", "n1", "active", "gpu", 8, 6, 2),
        ("gpus", "n1", "active", "mcpu", 64000, 2000, 62000),
        ("gpus", "n2", "cordoned", "gpu", 8, 3, 5),
        ("other", "n4", "active", "gpu", 8, 0, 8),
        (None, "n3", "active", "gpu", 4, 0, 4),  # in no pool: last
    ]
    assert list(rows[0].keys()) == ["pool", "node", "state", "key", "capacity", "allocated", "free"]


async def test_node_usage_free_goes_negative_after_a_shrink(db: asyncpg.Connection) -> None:
    await db.execute(
        "UPDATE respool.node_resources SET capacity = 1500"
        " WHERE key = 'mcpu' AND node_id = (SELECT id FROM respool.nodes WHERE name = 'n1')"
    )
    row = await db.fetchrow("SELECT * FROM respool.node_usage WHERE node = 'n1' AND key = 'mcpu'")
    assert (row["capacity"], row["allocated"], row["free"]) == (1500, 2000, -500)


async def test_device_holders_is_one_row_per_device(
    db: asyncpg.Connection, ids: dict[str, UUID]
) -> None:
    rows = await db.fetch(
        "SELECT pool, node, key, device, request_id, subject FROM respool.device_holders"
    )
    assert len(rows) == 16  # n1 and n2 have 8 named gpus each; n3 and n4 anonymous units
    n1 = [(r["device"], r["request_id"], r["subject"]) for r in rows if r["node"] == "n1"]
    a, b, c = ids["a"], ids["b"], ids["c"]
    assert n1 == [("0", a, "S"), ("1", a, "S"), ("2", a, "S"), ("3", a, "S"),
                  ("4", b, "S"), ("5", b, "S"), ("6", None, None), ("7", None, None)]  # fmt: skip
    n2 = [r["request_id"] for r in rows if r["node"] == "n2"]
    assert n2 == [c, c, c] + [None] * 5
    assert {(r["pool"], r["key"]) for r in rows} == {("gpus", "gpu")}
    names = list(rows[0].keys())
    assert names == ["pool", "node", "key", "device", "request_id", "subject"]


async def test_device_holders_keep_the_node_list_order(db: asyncpg.Connection) -> None:
    await _node(db, "m1", None, {"gpu": 3}, {"gpu": ["GPU-b", "MIG-a", "GPU-a"]})
    rows = await db.fetch("SELECT device FROM respool.device_holders WHERE node = 'm1'")
    assert [r["device"] for r in rows] == ["GPU-b", "MIG-a", "GPU-a"]


async def test_a_healthy_placed_state_has_no_violation(db: asyncpg.Connection) -> None:
    assert await violations(db) == []


def _fill(sql: str, ids: dict[str, UUID] | None = None) -> str:
    """``sql`` with {n1}/{n2} (node ids by name) and {a}..{d} (request ids) filled in."""
    nodes = {n: f"(SELECT id FROM respool.nodes WHERE name = '{n}')" for n in ("n1", "n2")}  # noqa: S608
    requests = {k: f"'{v}'::uuid" for k, v in (ids or {}).items() if k in "abcd"}
    return sql.format(**nodes, **requests)


# (what is broken, the SQL that breaks it ({a}..{d}: requests), the rows expected in
# (invariant, detail) order: invariant, pool, subject, key, and a part of detail).
Row = tuple[str, str | None, str | None, str | None, str]
BREAKS: list[tuple[str, list[str], list[Row]]] = [
    (
        "node capacity below what is placed on it",
        ["UPDATE respool.node_resources SET capacity = 1500 WHERE node_id = {n1} AND key = 'mcpu'"],
        [("I5", "gpus", None, "mcpu", "node n1: allocated 2000 > capacity 1500")],
    ),
    (
        "a placed key the node lacks (not soft: capacity 0)",
        [
            "UPDATE respool.placements SET resources = resources || '{{\"tpu\": 1}}'"
            " WHERE request_id = {a}",
        ],
        [  # a key with no node row is a missing counter as well
            ("I4", "gpus", None, "tpu", "node n1: counter missing, placed sum 1"),
            ("I5", "gpus", None, "tpu", "node n1: allocated 1 > capacity 0"),
        ],
    ),
    (
        "node counter below the placed sum",
        ["UPDATE respool.node_resources SET used = 5 WHERE node_id = {n1} AND key = 'gpu'"],
        [("I4", "gpus", None, "gpu", "node n1: counter 5 <> placed sum 6")],
    ),
    (
        "node counter of a node in no pool that holds nothing",
        [
            "UPDATE respool.node_resources SET used = 2 WHERE key = 'gpu'"
            " AND node_id = (SELECT id FROM respool.nodes WHERE name = 'n3')"
        ],
        [("I4", None, None, "gpu", "node n3: counter 2 <> placed sum 0")],
    ),
    (
        "a placed soft key the node does not track",
        [
            "UPDATE respool.placements SET resources = resources || '{{\"step_run\": 1}}'"
            " WHERE request_id = {c}",
        ],
        [("I4", "gpus", None, "step_run", "node n2: counter missing, placed sum 1")],
    ),
    (
        "a device held by a released request",
        ["UPDATE respool.node_devices SET holder_id = {d} WHERE node_id = {n1} AND device = '7'"],
        [("I6", "gpus", "S", "gpu", "device 7 held by request {d}, which is released")],
    ),
    (
        "a device held by a request placed on another node",
        ["UPDATE respool.node_devices SET holder_id = {c} WHERE node_id = {n1} AND device = '6'"],
        [("I6", "gpus", "S", "gpu", "device 6 held by request {c}, which is placed on node n2")],
    ),
    (
        "a holder with fewer devices than its placed units",
        ["UPDATE respool.node_devices SET holder_id = NULL WHERE node_id = {n1} AND device = '3'"],
        [("I6", "gpus", "S", "gpu", "node n1: request {a} holds 3 gpu devices, placed units 4")],
    ),
    (
        "a holder with more devices than its placed units",
        ["UPDATE respool.node_devices SET holder_id = {b} WHERE node_id = {n1} AND device = '7'"],
        [("I6", "gpus", "S", "gpu", "node n1: request {b} holds 3 gpu devices, placed units 2")],
    ),
    (
        "a holding request of a pool with nodes without a placement",
        [
            "DELETE FROM respool.placements WHERE request_id = {c}",
            "UPDATE respool.node_devices SET holder_id = NULL WHERE holder_id = {c}",
            "UPDATE respool.node_resources SET used = 0 WHERE node_id = {n2}",
        ],
        [("I7", "gpus", "S", None, "request {c} (allocated) is not placed on a node")],
    ),
    (
        "a holding request placed on a node of another pool",
        [
            "UPDATE respool.nodes SET pool_id = (SELECT id FROM respool.pools WHERE name = 'other')"
            " WHERE name = 'n2'"
        ],  # fmt: skip
        [("I7", "gpus", "S", None, "request {c} is placed on node n2, of pool other")],
    ),
    (
        "a holding request placed on a node in no pool",
        ["UPDATE respool.nodes SET pool_id = NULL WHERE name = 'n2'"],
        [("I7", "gpus", "S", None, "request {c} is placed on node n2, which is in no pool")],
    ),
    (
        "a placement left behind by a request that holds nothing",
        [
            "INSERT INTO respool.placements (request_id, node_id, resources)"
            " VALUES ({d}, {n1}, '{{}}')"
        ],
        [("I7", "gpus", "S", None, "request {d} is released but still placed on node n1")],
    ),
]


@pytest.mark.parametrize(("sqls", "expected"), [b[1:] for b in BREAKS], ids=[b[0] for b in BREAKS])
async def test_each_broken_fact_shows_its_row(
    db: asyncpg.Connection,
    ids: dict[str, UUID],
    sqls: list[str],
    expected: list[Row],
) -> None:
    for sql in sqls:
        await db.execute(_fill(sql, ids))
    got = await violations(db)
    assert [g[:4] for g in got] == [e[:4] for e in expected], got
    for g, e in zip(got, expected, strict=True):
        assert e[4].format(**{k: ids[k] for k in "abcd"}) in g[4]


async def test_metrics_count_and_the_reconciler_reads_node_rows(db: asyncpg.Connection) -> None:
    """The existing readers of the view take the new rows as they are (same columns)."""
    await db.execute(
        _fill(
            "UPDATE respool.node_resources SET capacity = 1 WHERE node_id = {n1} AND key = 'mcpu'"
        )
    )
    from app.db import metrics as db_metrics
    from app.db import reconcile as db_reconcile

    assert await db_metrics.invariant_violation_counts(db) == {"I5": 1}
    [v] = await db_reconcile.invariant_violations(db)
    assert (v.invariant, v.pool, v.key) == ("I5", "gpus", "mcpu")


async def test_the_reader_role_reads_the_node_views_only(db: asyncpg.Connection) -> None:
    role = await db.fetchval("SELECT respool.ensure_reader_role()")
    await db.execute(f'SET ROLE "{role}"')
    try:
        assert await db.fetchval("SELECT count(*) FROM respool.node_usage") == 5
        assert await db.fetchval("SELECT count(*) FROM respool.device_holders") == 16
        assert await db.fetchval("SELECT count(*) FROM respool.invariant_violations") == 0
        for table in ("nodes", "node_resources", "node_devices", "placements"):
            await assert_refused(db, f"SELECT * FROM respool.{table} LIMIT 1")  # noqa: S608
    finally:
        await db.execute("RESET ROLE")


async def test_the_views_follow_the_engine_placing_requests(db_url: str) -> None:
    """Granted through the engine: two 4-GPU requests on one 8-GPU node hold disjoint devices,
    a third waits; after a release it gets the freed devices. No violation at any step."""
    async with direct(db_url) as conn:
        await conn.execute("SELECT respool.create_pool(p_name => 'box', p_capacity => $1)",
                           {"gpu": 8})  # fmt: skip
        await conn.execute("SELECT respool.create_policy(p_subject => 'S', p_pool => 'box')")
        await _node(conn, "box1", "box", {"gpu": 8}, {"gpu": [str(i) for i in range(8)]})
        a, b = await _request(conn, "box", 4), await _request(conn, "box", 4)
        made = await conn.fetchval(
            "SELECT (respool.create_request($1)).request",
            {"subject": "S", "pool": "box", "resources": {"gpu": 4}},
        )
        assert made["status"] == "queued"
        holders = await conn.fetch(
            "SELECT device, request_id FROM respool.device_holders WHERE node = 'box1'"
        )
        by_holder = {h: {r["device"] for r in holders if r["request_id"] == h} for h in (a, b)}
        assert len(by_holder[a]) == len(by_holder[b]) == 4
        assert by_holder[a] | by_holder[b] == {str(i) for i in range(8)}
        usage = await conn.fetchrow("SELECT * FROM respool.node_usage WHERE node = 'box1'")
        assert (usage["allocated"], usage["free"]) == (8, 0)
        assert await violations(conn) == []

        await conn.execute("SELECT respool.release_request(p_id => $1)", a)
        c = UUID(made["id"])
        holders = await conn.fetch(
            "SELECT device FROM respool.device_holders WHERE node = 'box1' AND request_id = $1", c
        )
        assert {r["device"] for r in holders} == by_holder[a]
        assert await violations(conn) == []


async def test_a_node_shrink_shows_i5_until_the_reconciler_preempts(db_url: str) -> None:
    """An anonymous key shrunk below what its holders use is I5 (and I1: the pool's capacity is
    the nodes' sum) until one reconciler pass preempts on that node; then the view is empty."""
    async with direct(db_url) as conn:
        await conn.execute("SELECT respool.create_pool(p_name => 'anon')")
        await conn.execute("SELECT respool.create_policy(p_subject => 'S', p_pool => 'anon')")
        await conn.execute(
            "SELECT respool.create_node($1)", {"name": "a1", "pool": "anon", "capacity": {"gpu": 8}}
        )
        held = [await _request(conn, "anon", 4), await _request(conn, "anon", 4)]
        await conn.execute("SELECT respool.update_node('a1', $1)", {"capacity": {"gpu": 6}})
        got = await violations(conn)
        assert [g[:4] for g in got] == [
            ("I1", "anon", None, "gpu"),
            ("I5", "anon", None, "gpu"),
        ]
        assert "node a1: allocated 8 > capacity 6" in got[1][4]
        usage = await conn.fetchrow("SELECT * FROM respool.node_usage WHERE node = 'a1'")
        assert (usage["capacity"], usage["allocated"], usage["free"]) == (6, 8, -2)

        await reconcile(conn, "anon")
        assert await violations(conn) == []
        statuses = await conn.fetch(
            "SELECT status, reason FROM respool.requests WHERE id = ANY($1::uuid[])", held
        )
        assert sorted((r["status"], r["reason"]) for r in statuses) == [
            ("allocated", None),
            ("preempted", "capacity_shrink"),
        ]
