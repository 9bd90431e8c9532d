"""Batch create made set-based (docs/engine.md, "How a batch is made"; docs/api.md, "Batch create").

The contract: a batch leaves exactly what creating its members one by one, in member order,
leaves. The differential tests build the same world in two fresh databases, create the same
members (a) in one ``respool.create_requests`` call and (b) one by one through
``respool.create_request`` (member i at the batch's clock + i µs, as the batch queues it), and
compare everything a user or operator can see: statuses, pools, nodes, queue order and
positions, each request's events, the pool, policy and node counters and the answers.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from engine_support import assert_healthy, mk_gpu_node

from app.db import batch as db_batch
from app.db.dsn import with_database
from app.db.errors import BadInput, IdempotencyMismatch
from support.db import direct, drop_database_later, function_calls

T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
AT = T0 + timedelta(minutes=1)  # the batch's clock
ONE_AT_A_TIME = "respool._try_new(uuid, timestamptz)"


async def build(conn: asyncpg.Connection, world: str) -> None:
    """Pools a (4 gpu), b (6 gpu) and n (two nodes x and y of 4 gpu, labelled gpu-type);
    subject S on a (priority 10) and b, T on a (limit 2 gpu), U on n; one holder on a, and a
    request with key k1 made earlier. ``world``: a's queueing, or a pool that starves."""
    await conn.fetchval(
        "SELECT respool.create_pool(p_name => 'a', p_capacity => '{\"gpu\": 4}', p_queueing => $1,"
        " p_starvation_seconds => $2, p_now => $3)",
        "strict" if world == "strict" else "best_effort",
        0 if world == "starving" else 300,
        T0,
    )
    await conn.fetchval(
        "SELECT respool.create_pool(p_name => 'b', p_capacity => '{\"gpu\": 6}', p_now => $1)", T0
    )
    await conn.fetchval(
        "SELECT respool.create_pool(p_name => 'n', p_capacity => '{}', p_now => $1)", T0
    )
    for node in ("x", "y"):
        await mk_gpu_node(conn, node, "n", kind=node, gpus=4, now=T0)
    for subject, pool, priority, limit in (
        ("S", "a", 10, {}),
        ("S", "b", 0, {}),
        ("T", "a", 0, {"gpu": 2}),
        ("U", "n", 0, {}),
    ):
        await conn.fetchval(
            "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_priority => $3,"
            " p_limit => $4, p_now => $5)",
            subject,
            pool,
            priority,
            limit,
            T0,
        )
    await create_one(
        conn, {"subject": "S", "pool": "a", "resources": {"gpu": 1}, "labels": {"m": "holder"}}, T0
    )
    await create_one(
        conn,
        {
            "subject": "S",
            "pool": "b",
            "resources": {"gpu": 1},
            "idempotency_key": "k1",
            "labels": {"m": "k1"},
        },
        T0,
    )
    if world == "teams":
        # Three teams share pool b (5 gpu free): T without a bound, V with a limit of 2; and a
        # pool r of a rate key (5,000 tokens a minute) the three of them draw on.
        await conn.fetchval(
            "SELECT respool.create_pool(p_name => 'r', p_rates => $1, p_now => $2)",
            {"tok": {"amount": 5000, "per_seconds": 60}},
            T0,
        )
        for subject, pool, limit in (
            ("T", "b", {}),
            ("V", "b", {"gpu": 2}),
            ("S", "r", {}),
            ("T", "r", {}),
            ("V", "r", {}),
        ):
            await conn.fetchval(
                "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_limit => $3,"
                " p_now => $4)",
                subject,
                pool,
                limit,
                T0,
            )
    if world == "queue":
        # Earlier waiters of another subject in a, blocked by the holder and T's own limit.
        await create_one(
            conn, {"subject": "T", "pool": "a", "resources": {"gpu": 2}, "labels": {"m": "w1"}}, T0
        )
        await create_one(
            conn, {"subject": "T", "pool": "a", "resources": {"gpu": 3}, "labels": {"m": "w2"}}, T0
        )


async def create_one(
    conn: asyncpg.Connection, body: dict[str, Any], at: datetime
) -> dict[str, Any]:
    row = await conn.fetchrow(
        "SELECT created, request FROM respool.create_request($1, p_default_lease_seconds => 300,"
        " p_now => $2)",
        body,
        at,
    )
    assert row is not None
    return {"created": row["created"], "request": row["request"]}


def member(i: int, **body: Any) -> dict[str, Any]:
    return {**body, "labels": {**body.get("labels", {}), "m": str(i)}}


def mixed_members() -> list[dict[str, Any]]:
    """Several subjects and pools; fits and waits; rejections; replays of a stored key and of a
    key named twice in the batch; node selectors on a pool with nodes; fewer bodies than members."""
    gpu = {"gpu": 1}
    k2 = {"subject": "S", "pool": "b", "resources": gpu, "idempotency_key": "k2"}
    k2 |= {"max_seconds": 60, "labels": {"m": "k2"}}
    raw: list[dict[str, Any]] = [
        {"subject": "S", "resources": {"gpu": 2}},  # a (priority 10), else b, else queued
        {"subject": "S", "resources": {"gpu": 2}},
        {"subject": "S", "resources": {"gpu": 2}},
        {"subject": "S", "pool": "a", "resources": {"gpu": 3}},  # waits in a
        {"subject": "T", "pool": "a", "resources": gpu},  # T's limit: 2
        {"subject": "T", "pool": "a", "resources": gpu},
        {"subject": "T", "pool": "a", "resources": gpu},
        {"subject": "T", "pool": "a", "resources": {"gpu": 5}},  # exceeds_capacity / limit
        {"subject": "nobody", "resources": gpu},  # no_policy
        {"subject": "S", "pool": "n", "resources": gpu},  # S has no policy on n
        {"subject": "S", "pool": "b", "resources": {"gpu": 99}},  # exceeds_capacity
        {"subject": "U", "pool": "n", "resources": {"gpu": 3}, "node_selector": {"gpu-type": "x"}},
        {"subject": "U", "pool": "n", "resources": {"gpu": 2}, "node_selector": {"gpu-type": "x"}},
        {"subject": "U", "pool": "n", "resources": {"gpu": 2}, "settings": {"gpu_type": "y"}},
        {"subject": "U", "pool": "n", "resources": {"gpu": 2}, "settings": {"gpu_type": "y"}},
        {
            "subject": "U",
            "pool": "n",
            "resources": gpu,
            "node_selector": {"gpu-type": "z"},
        },  # no node
        {"subject": "U", "pool": "n", "resources": gpu},
        {
            "subject": "S",
            "pool": "b",
            "resources": gpu,
            "idempotency_key": "k1",
            "labels": {"m": "k1"},
        },
        k2,
        {"subject": "S", "resources": gpu, "preemptible": False, "lease_seconds": None},
        k2,  # a replay of k2
        {"subject": "T", "resources": gpu, "preemption_group": "g"},
        {"subject": "S", "resources": {"gpu": 1}},
    ]
    # Replays carry the stored body (labels included); every other member its own label.
    return [b if "idempotency_key" in b else member(i, **b) for i, b in enumerate(raw)]


async def snapshot(conn: asyncpg.Connection, ids: list[str]) -> dict[str, Any]:
    """What a user or operator sees, each request id replaced by its member's label."""
    names = {
        r["id"]: r["m"] or r["id"]
        for r in await conn.fetch("SELECT id::text, labels ->> 'm' AS m FROM respool.requests")
    }
    for i, rid in enumerate(ids):
        names.setdefault(rid, f"member {i}")

    def name(rid: Any) -> str:
        return names.get(str(rid), "?")

    requests = [
        {**dict(r), "id": name(r["id"])}
        for r in await conn.fetch(
            "SELECT r.id::text, r.status, r.reason, r.message, r.pool_name, r.priority,"
            " r.attempt, r.version,"
            " r.preemptible, r.max_retries, r.lease_seconds, r.max_seconds, r.idempotency_key,"
            " r.request_body::text,"
            " r.resources::text, r.labels::text, r.node_selector::text, r.preemption_group,"
            " r.queued_at, r.created_at,"
            " r.updated_at, r.finished_at, r.allocated_at, r.lease_expires_at, r.run_deadline,"
            " r.np_charge::text,"
            " (SELECT array_agg(p.name ORDER BY c.k) FROM unnest(r.candidate_pool_ids) WITH"
            " ORDINALITY c(id, k)"
            "   JOIN respool.pools p ON p.id = c.id) AS candidates,"
            " (SELECT n.name FROM respool.placements pl JOIN respool.nodes n ON n.id = pl.node_id"
            "   WHERE pl.request_id = r.id) AS node,"
            " (SELECT array_agg(d.device ORDER BY d.position) FROM respool.node_devices d"
            "   WHERE d.holder_id = r.id) AS devices"
            " FROM respool.requests r"
        )
    ]
    events = [
        (
            name(e["request_id"]),
            e["at"],
            e["from_status"],
            e["to_status"],
            e["reason"],
            e["attempt"],
            e["message"],
        )
        for e in await conn.fetch(
            "SELECT request_id, at, from_status, to_status, reason, attempt, message FROM"
            " respool.events ORDER BY id"
        )
    ]
    per_request: dict[str, list[Any]] = {}
    for e in events:
        per_request.setdefault(e[0], []).append(e[1:])
    queue = [
        (q["pool"], q["position"], name(q["request_id"]))
        for q in await conn.fetch(
            "SELECT pool, position, request_id FROM respool.queue ORDER BY pool, position"
        )
    ]
    counters = [
        tuple(r)
        for r in await conn.fetch(
            "SELECT 'pool', p.name, NULL, pr.key, pr.used, NULL::bigint FROM"
            " respool.pool_resources pr"
            "  JOIN respool.pools p ON p.id = pr.pool_id"
            " UNION ALL SELECT 'policy', p.name, po.subject, r.key, r.used, r.np_used FROM"
            " respool.policy_resources r"
            "  JOIN respool.policies po ON po.id = r.policy_id JOIN respool.pools p ON p.id ="
            " po.pool_id"
            " UNION ALL SELECT 'node', n.name, NULL, nr.key, nr.used, NULL FROM"
            " respool.node_resources nr"
            "  JOIN respool.nodes n ON n.id = nr.node_id"
            " ORDER BY 1, 2, 3, 4"
        )
    ]
    return {
        "requests": sorted(requests, key=lambda r: str(r["id"])),
        "events": dict(sorted(per_request.items())),
        "queue": queue,
        "counters": counters,
    }


UUID = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|…)")
WAITED = re.compile(r"waiting \d+ s")


def _plain(value: Any) -> Any:
    """A document with every id (they differ between databases) and the seconds a head has
    waited by the database's clock (read at each answer) left out."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "eta"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return WAITED.sub("waiting N s", UUID.sub("<id>", value))
    return value


def answers(rows: list[dict[str, Any]], ids: list[str]) -> list[Any]:
    """(created, the first member answering with that request, its document without ids)."""
    return [(r["created"], ids.index(r["request"]["id"]), _plain(r["request"])) for r in rows]


class Fresh:
    """Fresh migrated databases, each built the same way."""

    def __init__(self, admin_url: str, copies: Any) -> None:
        self.admin_url, self.copies = admin_url, copies
        self.names: list[str] = []

    def take(self) -> str:
        name = self.copies.take()
        self.names.append(name)
        return with_database(self.admin_url, name)

    def drop(self) -> None:
        for name in self.names:
            drop_database_later(self.admin_url, name)


@pytest.fixture
def fresh(admin_url: str, copies: Any) -> Any:
    made = Fresh(admin_url, copies)
    yield made
    made.drop()


async def both_ways(
    fresh: Fresh, world: str, members: list[dict[str, Any]]
) -> tuple[Any, Any, int]:
    """(batch, one by one) snapshots and answers, and how many members the batch tried one at a
    time through their pools' queues (respool._try_new calls: 0 when every member was tried
    alone, runs of alike members together)."""
    async with direct(fresh.take()) as conn:
        await build(conn, world)
        await conn.execute("SET track_functions = 'all'")
        async with conn.transaction():
            rows = await conn.fetch(
                "SELECT created, request FROM respool.create_requests($1, p_default_lease_seconds"
                " => 300,"
                " p_now => $2) ORDER BY member",
                members,
                AT,
            )
            one_by_one_calls = await function_calls(conn, ONE_AT_A_TIME)
        batch_rows = [{"created": r["created"], "request": r["request"]} for r in rows]
        batch_ids = [r["request"]["id"] for r in batch_rows]
        batch = (await snapshot(conn, batch_ids), answers(batch_rows, batch_ids))
        await assert_healthy(conn)
    async with direct(fresh.take()) as conn:
        await build(conn, world)
        singles = []
        async with conn.transaction():
            for i, body in enumerate(members):
                singles.append(await create_one(conn, body, AT + timedelta(microseconds=i)))
        rows2 = await conn.fetch(
            "SELECT id, doc FROM respool.request_docs($1::uuid[])",
            [s["request"]["id"] for s in singles],
        )
        docs = {
            str(r["id"]): json.loads(r["doc"]) if isinstance(r["doc"], str) else r["doc"]
            for r in rows2
        }
        single_rows = [
            {"created": s["created"], "request": docs[s["request"]["id"]]} for s in singles
        ]
        single_ids = [s["request"]["id"] for s in singles]
        one = (await snapshot(conn, single_ids), answers(single_rows, single_ids))
        await assert_healthy(conn)
    return batch, one, one_by_one_calls


@pytest.mark.parametrize("world", ["plain", "queue", "strict", "starving"])
async def test_a_batch_leaves_what_one_by_one_leaves(fresh: Fresh, world: str) -> None:
    members = mixed_members()
    batch, one, one_by_one = await both_ways(fresh, world, members)
    assert batch[0] == one[0]  # requests, events per request, queues, counters
    assert batch[1] == one[1]  # the answers
    # members tried alone, alike ones together, where that decides alike; one at a time through
    # the queue where a pool is strict or holds (or may start holding) for a starving head
    assert (one_by_one == 0) == (world in ("plain", "queue"))
    statuses = [r["status"] for r in (d for _c, _i, d in batch[1])]
    assert {"allocated", "queued", "rejected"} <= set(statuses)


async def test_a_thousand_alike_members_one_shape_tried_once(fresh: Fresh) -> None:
    members = [member(i, subject="S", pool="a", resources={"gpu": 1}) for i in range(300)]
    batch, one, one_by_one = await both_ways(fresh, "plain", members)
    assert batch == one
    assert one_by_one == 0
    answered = [d for _c, _i, d in batch[1]]
    assert [d["status"] for d in answered] == ["allocated"] * 3 + ["queued"] * 297
    assert [d["queue_position"] for d in answered[3:]] == list(range(1, 298))


@pytest.mark.parametrize(("world", "tries"), [("strict", 1), ("starving", 9)])
async def test_alike_members_after_one_that_waits_wait_without_a_pass_each(
    fresh: Fresh, world: str, tries: int
) -> None:
    """In a strict pool, alike members are tried through the queue until one of them waits:
    those after it wait too, as one by one leaves them, without a pass each. Where a starvation
    hold decides, each is tried (the hold's head may become the member that waits)."""
    members = [member(i, subject="S", pool="a", resources={"gpu": 1}) for i in range(12)]
    batch, one, one_by_one = await both_ways(fresh, world, members)
    assert batch == one
    answered = [d["status"] for _c, _i, d in batch[1]]
    assert "allocated" in answered
    assert answered.count("queued") == 9
    assert one_by_one == tries


@pytest.mark.parametrize(
    ("pool", "resources", "teams", "granted"),
    [
        # callers of three teams interleaved, all of them fit
        ("b", {"gpu": 1}, "STSVT", 5),
        ("r", {"tok": 1000}, "STVST", 5),
        # more than fit: each member as one by one decides (V's limit, then the pool's room)
        ("b", {"gpu": 1}, "SVTVSVTS", 5),
        ("r", {"tok": 1000}, "STVSTVS", 5),
    ],
)
async def test_interleaved_teams_leave_what_one_by_one_leaves(
    fresh: Fresh,
    pool: str,
    resources: dict[str, int],
    teams: str,
    granted: int,
) -> None:
    members = [member(i, subject=t, pool=pool, resources=resources) for i, t in enumerate(teams)]
    batch, one, _tried = await both_ways(fresh, "teams", members)
    assert batch == one
    answered = [d for _c, _i, d in batch[1]]
    assert [d["status"] for d in answered].count("allocated") == granted


async def test_set_path_grants_without_notifying_the_members(fresh: Fresh) -> None:
    async with direct(fresh.take()) as conn:
        await build(conn, "plain")
        heard: list[str] = []
        await conn.add_listener("respool_request", lambda *a: heard.append(a[3]))
        made = await db_batch.create_requests(
            conn, [member(i, subject="S", pool="b", resources={"gpu": 1}) for i in range(3)]
        )
        await conn.execute("SELECT 1")  # deliver anything queued for us
        assert [m.request.status for m in made] == ["allocated"] * 3
        assert heard == []
        await assert_healthy(conn)


async def test_refusals_name_the_first_refused_member(fresh: Fresh) -> None:
    async with direct(fresh.take()) as conn:
        await build(conn, "plain")
        before = await conn.fetchval("SELECT count(*) FROM respool.requests")
        good = member(0, subject="S", pool="b", resources={"gpu": 1})
        with pytest.raises(BadInput) as bad:
            await db_batch.create_requests(
                conn, [good, good, {"subject": "S", "pool": "b", "resources": {"gpu": -1}}]
            )
        assert bad.value.field == "members[2].resources.gpu"
        with pytest.raises(BadInput) as unknown:
            await db_batch.create_requests(
                conn, [good, {**good, "colour": "red"}, {"subject": "S", "bogus": 1}]
            )
        assert unknown.value.field == "members[1].colour"
        with pytest.raises(IdempotencyMismatch) as mismatch:
            await db_batch.create_requests(
                conn,
                [
                    {"subject": "S", "pool": "b", "resources": {"gpu": 1}, "idempotency_key": "k9"},
                    {"subject": "S", "pool": "b", "resources": {"gpu": 2}, "idempotency_key": "k9"},
                ],
            )
        assert mismatch.value.field == "members[1].idempotency_key"
        with pytest.raises(IdempotencyMismatch) as stored:
            await db_batch.create_requests(
                conn,
                [
                    good,
                    {"subject": "S", "pool": "b", "resources": {"gpu": 2}, "idempotency_key": "k1"},
                ],
            )
        assert stored.value.field == "members[1].idempotency_key"
        assert (
            await conn.fetchval("SELECT count(*) FROM respool.requests") == before
        )  # nothing made
        await assert_healthy(conn)


async def test_runs_of_alike_members_spill_over_pools_as_one_by_one(fresh: Fresh) -> None:
    shapes = (
        [{"subject": "S", "resources": {"gpu": 1}}] * 10  # 3 fit a, 5 fit b, 2 wait
        + [{"subject": "T", "pool": "a", "resources": {"gpu": 1}}] * 3
        + [{"subject": "S", "resources": {"gpu": 2}}] * 2
        + [{"subject": "U", "pool": "n", "resources": {"gpu": 1}}] * 9  # 8 fit the two nodes
        + [{"subject": "S", "pool": "b", "resources": {"gpu": 1}}] * 2
    )
    members = [member(i, **body) for i, body in enumerate(shapes)]
    batch, one, one_by_one = await both_ways(fresh, "plain", members)
    assert batch == one
    assert one_by_one == 0
    answered = [d for _c, _i, d in batch[1]]
    assert [d["pool"] for d in answered[:10]] == ["a"] * 3 + ["b"] * 5 + [None] * 2
    assert [d["status"] for d in answered[15:24]] == ["allocated"] * 8 + ["queued"]
