"""Concurrency storm on pools backed by nodes (docs/placement.md): real connections create,
release and cancel requests (with node selectors, and gangs with and without ``distinct_nodes``)
while other workers add and remove nodes, shrink and grow a node's anonymous ``mcpu``, cordon,
drain and uncordon nodes, and run reconciler passes. An auditor reads one REPEATABLE READ
snapshot at a time and checks the node invariants (I4 node counters, I5, I6 one holder per device,
I7 every holding request placed on a node of its pool: ``test_placement.NODE_INVARIANTS_SQL``)
plus ``respool.invariant_violations`` and the pools' allocated <= capacity.

Node shrinks are enforced in the shrinking transaction (``update_node`` then ``reconcile_pool``
while it holds the pool), so a snapshot never sees a shrink not yet enforced (I5 "within one
interval" is then "at once").

Deadlocks (40P01) and RP500/RP501 (InvariantBroken) must be 0; Conflict and NotFound (a request
or node another worker finished or removed first, a reserved share that would no longer fit) are
expected; anything else fails the test.

The broken device twin (``support.twins``: ``_place_on_node`` takes devices without looking at
their holders) must be caught: by a short deterministic test in the quick loop, and by the storm.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from test_placement import NODE_INVARIANTS_SQL

from app.db.errors import Conflict, NotFound, translate
from support import storm
from support.storm import StormStats, storm_db
from support.twins import install_twin

STORM_SECONDS = float(os.environ.get("RESPOOL_STORM_SECONDS", "10"))
TWIN_SECONDS = 3.0
WORKERS = 16

# pool -> placement; nodes: name -> (pool, capacity, gpu device ids, labels)
POOLS = {"nodes-pack": "pack", "nodes-spread": "spread"}
NODES: dict[str, tuple[str, dict[str, int], list[str], dict[str, str]]] = {
    "n1": ("nodes-pack", {"mcpu": 16000}, [str(i) for i in range(8)], {"gpu-type": "A100"}),
    "n2": ("nodes-pack", {"mcpu": 8000}, ["0", "1", "2", "3"], {"gpu-type": "L4"}),
    "n3": ("nodes-pack", {"mcpu": 8000}, [], {}),
    "m1": ("nodes-spread", {"mcpu": 8000}, ["g0", "g1", "g2", "g3"], {"gpu-type": "A100"}),
    "m2": ("nodes-spread", {"mcpu": 8000}, ["g0", "g1", "g2", "g3"], {"gpu-type": "A100"}),
}
SHRINKABLE = ("n1", "n2", "n3", "m1")  # mcpu shrinks and grows (anonymous units)
# (subject, pool, priority, reserved)
POLICIES = [
    ("a", "nodes-pack", 1, {"gpu": 2}),
    ("b", "nodes-pack", 0, {}),
    ("c", "nodes-pack", 2, {}),
    ("a", "nodes-spread", 0, {}),
    ("b", "nodes-spread", 1, {"gpu": 1}),
]
SUBJECT_POOLS: dict[str, list[str]] = {}
for _subject, _pool, *_ in POLICIES:
    SUBJECT_POOLS.setdefault(_subject, []).append(_pool)
SELECTORS: list[dict[str, str]] = [
    {},
    {},
    {},
    {"gpu-type": "A100"},
    {"gpu-type": "L4"},
    {"node": "n1"},
    {"node": "n2"},
    {"node": "m1"},
]
HOLDING = ("queued", "allocated", "preempting")


@dataclass
class Storm(StormStats):
    node_ops: bool = True
    invariant_broken: int = 0
    live: set[Any] = field(default_factory=set)
    extra_nodes: int = 0
    placed_seen: int = 0

    def summary(self) -> str:
        return (
            f"node storm: {sum(self.ops.values())} operations over {WORKERS} connections;"
            f" ops {dict(self.ops)}; placements seen {self.placed_seen};"
            f" RP500/RP501 {self.invariant_broken}; {self.tallies()}"
        )


def _body(rng: random.Random, subject: str, pool: str, selector: dict[str, str]) -> dict[str, Any]:
    resources: dict[str, int] = {}
    if rng.random() < 0.8:
        resources["gpu"] = rng.choice([1, 1, 2, 2, 3, 4])
    if rng.random() < 0.4:
        resources["mcpu"] = rng.choice([500, 1000, 4000])
    body: dict[str, Any] = {
        "subject": subject,
        "pool": pool,
        "resources": resources,
        "preemptible": rng.random() < 0.85,
        "lease_seconds": None,
    }
    if selector:
        body["node_selector"] = selector
    return body


def _track(st: Storm, doc: dict[str, Any]) -> None:
    if doc["status"] in HOLDING:
        st.live.add(doc["id"])
    else:
        st.live.discard(doc["id"])
    if doc.get("placement"):
        st.placed_seen += 1


async def _create(conn: asyncpg.Connection, st: Storm, rng: random.Random) -> str:
    subject = rng.choice(sorted(SUBJECT_POOLS))
    pool = rng.choice(SUBJECT_POOLS[subject])
    selector = rng.choice(SELECTORS)
    if rng.random() < 0.25:
        n = rng.randint(2, 3)
        distinct = rng.random() < 0.6
        body = _body(rng, subject, pool, selector)
        body["preemptible"] = True
        rows = await conn.fetch(
            "SELECT request FROM respool.create_requests($1, p_all_or_nothing => true,"
            " p_distinct_nodes => $2)",
            [body] * n,
            distinct,
        )
        for r in rows:
            _track(st, r["request"])
        return "gang_distinct" if distinct else "gang"
    doc = await conn.fetchval(
        "SELECT request FROM respool.create_request($1)", _body(rng, subject, pool, selector)
    )
    _track(st, doc)
    return "create"


async def _finish(conn: asyncpg.Connection, st: Storm, rng: random.Random, kind: str) -> str:
    if not st.live:
        return await _create(conn, st, rng)
    rid = rng.choice(sorted(st.live, key=str))
    doc = await conn.fetchval(f"SELECT respool.{kind}_request(p_id => $1)", rid)
    _track(st, doc)
    return kind


async def _reconcile(conn: asyncpg.Connection, rng: random.Random) -> str:
    await conn.fetchval(
        "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = $1))",
        rng.choice(sorted(POOLS)),
    )
    return "reconcile"


async def _node_op(conn: asyncpg.Connection, st: Storm, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.35:
        # Shrink or grow a node's anonymous mcpu and enforce it in the same transaction.
        name = rng.choice(SHRINKABLE)
        async with conn.transaction():
            node = await conn.fetchval(
                "SELECT respool.update_node($1, $2)",
                name,
                {"capacity": {"mcpu": rng.choice([1000, 2000, 4000, 8000, 16000])}},
            )
            await conn.fetchval(
                "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = $1))",
                node["pool"],
            )
        return "node_resize"
    if roll < 0.7:
        name = rng.choice(sorted(NODES))
        state = rng.choice(["cordoned", "draining", "active", "active"])
        async with conn.transaction():
            node = await conn.fetchval("SELECT respool.set_node_state($1, $2)", name, state)
            if state == "draining":
                await conn.fetchval(
                    "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = $1))",
                    node["pool"],
                )
        return f"node_{state}"
    if roll < 0.85:
        st.extra_nodes += 1
        await conn.fetchval(
            "SELECT respool.create_node($1)",
            {
                "name": f"x{st.extra_nodes}",
                "pool": rng.choice(sorted(POOLS)),
                "capacity": {"mcpu": 4000},
                "devices": {"gpu": [f"x{i}" for i in range(rng.randint(1, 4))]},
                "labels": {"gpu-type": rng.choice(["A100", "L4"])},
            },
        )
        return "node_add"
    extra = await conn.fetch("SELECT name FROM respool.nodes WHERE name LIKE 'x%' ORDER BY name")
    if not extra:
        return "node_delete_none"
    await conn.execute("SELECT respool.delete_node($1, p_force => true)", rng.choice(extra)["name"])
    return "node_delete"


async def _step(conn: asyncpg.Connection, st: Storm, rng: random.Random) -> str:
    roll = rng.random()
    if len(st.live) > 150:
        roll = 0.5
    if roll < 0.4:
        return await _create(conn, st, rng)
    if roll < 0.8:
        return await _finish(conn, st, rng, "release" if roll < 0.65 else "cancel")
    if roll < 0.87 or not st.node_ops:
        return await _reconcile(conn, rng)
    return await _node_op(conn, st, rng)


def _on_error(st: Storm, exc: Exception) -> None:
    if not isinstance(exc, asyncpg.PostgresError):
        st.unexpected.append(f"{type(exc).__name__}: {exc}")
        return
    err = translate(exc)
    if isinstance(err, (Conflict, NotFound)):
        st.expected(err)
    elif exc.sqlstate in ("RP500", "RP501"):
        st.invariant_broken += 1
        st.errors_sample.append(f"{exc.sqlstate}: {exc}")
    else:
        st.unexpected.append(f"{type(exc).__name__} {exc.sqlstate}: {exc}")


AUDIT_SQL = (
    NODE_INVARIANTS_SQL
    + """
UNION ALL
SELECT invariant || ' ' || coalesce(pool, '-') || ' ' || coalesce(subject, '-') || ' '
       || coalesce(key, '-') || ': ' || detail
  FROM respool.invariant_violations
UNION ALL
SELECT 'I1/pool_usage ' || pool || ' ' || key || ': allocated ' || allocated || ' > capacity '
       || capacity
  FROM respool.pool_usage WHERE capacity IS NOT NULL AND allocated > capacity
"""
)


async def _audit_once(conn: asyncpg.Connection, st: Storm) -> None:
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        rows = await conn.fetch(AUDIT_SQL)
    st.snapshots += 1
    st.record([r[0] for r in rows])


async def _setup(conn: asyncpg.Connection) -> None:
    for name, placement in POOLS.items():
        await conn.fetchval(
            "SELECT respool.create_pool(p_name => $1, p_placement => $2)", name, placement
        )
    for name, (pool, capacity, gpus, labels) in NODES.items():
        body: dict[str, Any] = {"name": name, "pool": pool, "capacity": capacity, "labels": labels}
        if gpus:
            body["devices"] = {"gpu": gpus}
        await conn.fetchval("SELECT respool.create_node($1)", body)
    for subject, pool, priority, reserved in POLICIES:
        await conn.fetchval(
            "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_priority => $3,"
            " p_reserved => $4)",
            subject,
            pool,
            priority,
            reserved,
        )


async def _run(dsn: str, seconds: float, *, node_ops: bool = True) -> Storm:
    st = Storm(deadline=float("inf"), node_ops=node_ops)
    worker = storm.worker("respool-node-storm", _step, _on_error)
    return await storm.run(
        dsn, st, seconds, workers=WORKERS, worker=worker, audit_once=_audit_once, period=0.05
    )


@pytest.mark.slow
async def test_node_storm_keeps_node_invariants(db_url: str) -> None:
    async with storm_db(db_url, _setup) as conn:
        st = await _run(db_url, STORM_SECONDS)
        print(f"\n{st.summary()}")
        # Quiet state: every node active again, one pass per pool, then end everything.
        for name in await conn.fetch("SELECT name FROM respool.nodes ORDER BY name"):
            await conn.fetchval("SELECT respool.set_node_state($1, 'active')", name["name"])
        for pool in POOLS:
            await conn.fetchval(
                "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = $1))",
                pool,
            )
        assert [r[0] for r in await conn.fetch(AUDIT_SQL)] == []
        for row in await conn.fetch(
            "SELECT id FROM respool.requests WHERE status = ANY($1::text[])", list(HOLDING)
        ):
            await conn.fetchval("SELECT respool.cancel_request(p_id => $1)", row["id"])
        context = st.assert_clean(st.summary())
        assert st.invariant_broken == 0, context
        assert st.placed_seen > 0, context
        assert st.ops["node_resize"] + st.ops["node_draining"] + st.ops["node_add"] > 0, context
        assert await conn.fetchval("SELECT coalesce(sum(used), 0) FROM respool.node_resources") == 0
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM respool.node_devices WHERE holder_id IS NOT NULL"
            )
            == 0
        )
        assert [r[0] for r in await conn.fetch(AUDIT_SQL)] == []


@pytest.mark.slow
async def test_broken_device_twin_is_caught_by_the_storm(db_url: str) -> None:
    """The storm against a _place_on_node that ignores device holders: the auditor objects."""
    async with storm_db(db_url, _setup, "broken_device_twin"):
        st = await _run(db_url, TWIN_SECONDS, node_ops=False)
        print(f"\nbroken device twin {st.summary()}")
        context = f"{st.summary()}\nunexpected: {st.unexpected[:10]}"
        assert not st.unexpected, context
        assert st.violation_kinds["I6"] > 0, context


@pytest.mark.parametrize("twin", [None, "broken_device_twin"])
async def test_broken_device_twin_is_caught(conn: asyncpg.Connection, twin: str | None) -> None:
    """Two grants on one 4-gpu node: the engine gives them devices 0,1 and 2,3; the twin gives
    the second 0,1 again (one device, two allocations), and the node auditor reports I6."""
    await _setup(conn)
    if twin:
        await install_twin(conn, twin)
    docs = [
        await conn.fetchval(
            "SELECT request FROM respool.create_request($1)",
            {
                "subject": "a",
                "pool": "nodes-pack",
                "resources": {"gpu": 2},
                "node_selector": {"node": "n2"},
            },
        )
        for _ in range(2)
    ]
    assert [d["status"] for d in docs] == ["allocated", "allocated"]
    found = [r[0] for r in await conn.fetch(AUDIT_SQL)]
    if twin is None:
        assert [d["placement"]["devices"] for d in docs] == [
            {"gpu": ["0", "1"]},
            {"gpu": ["2", "3"]},
        ]
        assert found == []
    else:
        assert docs[1]["placement"]["devices"] == {"gpu": ["0", "1"]}
        assert any(v.startswith("I6 ") for v in found), found
