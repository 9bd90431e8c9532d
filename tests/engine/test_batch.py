"""Batch create (docs/scheduling.md): every member in one transaction, each exactly as a
single create."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from engine_support import (
    allocated,
    assert_healthy,
    events,
    mk_policy,
    mk_pool,
    mk_pool_s,
    mk_pools,
    mk_req,
    queue_ids,
    statuses,
)

from app.db import batch as db_batch
from app.db import requests as db_requests
from app.db.connect import APP_API, connect, create_pool
from app.db.errors import BadInput, IdempotencyMismatch, NotFound


def one_gpu(**kw: Any) -> dict[str, Any]:
    return {"subject": "S", "pool": "p", "resources": {"gpu": 1}, **kw}


async def count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM respool.requests"))


async def test_grants_in_member_order_and_queues_the_rest(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 4})
    made = await db_batch.create_requests(conn, [one_gpu(labels={"i": str(i)}) for i in range(7)])
    assert [m.created for m in made] == [True] * 7
    reqs = [m.request for m in made]
    assert [r.labels["i"] for r in reqs] == [str(i) for i in range(7)]  # answers in member order
    assert [r.status for r in reqs] == ["allocated"] * 4 + ["queued"] * 3
    assert [r.queue_position for r in reqs[4:]] == [1, 2, 3]
    assert await queue_ids(conn, "p") == [r.id for r in reqs[4:]]  # queue order = member order
    assert await allocated(conn, "p") == {"gpu": 4, "step_run": 4}
    # each member has the history of a single create
    assert await events(conn, reqs[0].id) == [(None, "queued", None), ("queued", "allocated", None)]
    assert await events(conn, reqs[6].id) == [(None, "queued", None)]
    await assert_healthy(conn)


async def test_members_behind_an_earlier_queue_wait_their_turn(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 2})
    holder = await mk_req(conn, "S", "p", resources={"gpu": 2})
    earlier = await mk_req(conn, "S", "p", resources={"gpu": 1})
    made = await db_batch.create_requests(conn, [one_gpu(), one_gpu()])
    assert [m.request.status for m in made] == ["queued", "queued"]
    assert await queue_ids(conn, "p") == [earlier.id, made[0].request.id, made[1].request.id]
    await db_requests.release_request(conn, holder.id)
    assert await statuses(conn, earlier.id, made[0].request.id, made[1].request.id) == [
        "allocated",
        "allocated",
        "queued",
    ]
    await assert_healthy(conn)


async def test_each_member_validated_and_rejected_on_its_own(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 4})
    await mk_policy(conn, "S", "p", limit={"gpu": 3})
    made = await db_batch.create_requests(
        conn,
        [
            one_gpu(resources={"gpu": 9}),
            {"subject": "nobody", "resources": {"gpu": 1}},
            one_gpu(resources={"gpu": 2}, preemptible=False),
            {"subject": "S", "settings": {"gpu_count": 2}, "lease_seconds": None},
            one_gpu(resources={"gpu": 1}),
        ],
        default_lease_seconds=120,
    )
    reqs = [m.request for m in made]
    assert [(r.status, r.reason) for r in reqs] == [
        ("rejected", "exceeds_capacity"),
        ("rejected", "no_policy"),
        ("rejected", "exceeds_reserved"),
        ("allocated", None),
        ("allocated", None),
    ]
    assert reqs[3].resources == {"gpu": 2, "step_run": 1} and reqs[3].lease_seconds is None
    assert reqs[4].lease_seconds == 120  # no lease_seconds key: the default
    assert await allocated(conn, "p") == {"gpu": 3, "step_run": 2}
    await assert_healthy(conn)


async def test_idempotency_per_member(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 4})
    single = await db_requests.create_request(
        conn, {"subject": "S", "pool": "p", "resources": {"gpu": 1}, "idempotency_key": "a"}
    )
    members = [
        one_gpu(idempotency_key="a"),
        one_gpu(idempotency_key="b"),
        one_gpu(),
        one_gpu(idempotency_key="b"),  # the same key twice in one batch: one request
    ]
    first = await db_batch.create_requests(conn, members)
    assert [m.created for m in first] == [False, True, True, False]
    assert first[0].request.id == single.request.id
    assert first[3].request.id == first[1].request.id
    again = await db_batch.create_requests(conn, members)
    assert [m.created for m in again] == [False, False, True, False]  # the keyless one is new
    assert again[1].request.id == first[1].request.id
    assert await count(conn) == 4
    await assert_healthy(conn)


@pytest.mark.parametrize(
    ("bad", "error", "field"),
    [
        ({"subject": "S", "resources": {"GPU": 1}}, BadInput, "members[2].resources.GPU"),
        ({"subject": "S", "resources": {"gpu": -1}}, BadInput, "members[2].resources.gpu"),
        ({"subject": "bad subject"}, BadInput, "members[2].subject"),
        ({"pool": "p"}, BadInput, "members[2].subject"),
        ({"subject": "S", "colour": "red"}, BadInput, "members[2].colour"),
        ({"subject": "S", "max_retries": "1"}, BadInput, "members[2].max_retries"),
        ({"subject": "S", "max_retries": 5000}, BadInput, "members[2].max_retries"),
        ({"subject": "S", "lease_seconds": 1.5}, BadInput, "members[2].lease_seconds"),
        ({"subject": "S", "preemptible": "yes"}, BadInput, "members[2].preemptible"),
        ({"subject": "S", "labels": {"a": 1}}, BadInput, "members[2].labels.a"),
        ({"subject": "S", "pool": "nope"}, NotFound, "members[2].pool"),
        ("not an object", BadInput, "members[2]"),
        (
            one_gpu(resources={"gpu": 2}, idempotency_key="k"),
            IdempotencyMismatch,
            "members[2].idempotency_key",
        ),
    ],
)
async def test_a_bad_member_refuses_the_whole_batch(
    conn: asyncpg.Connection, bad: Any, error: type[Exception], field: str
) -> None:
    await mk_pool_s(conn, {"gpu": 4})
    await db_requests.create_request(
        conn, {"subject": "S", "pool": "p", "resources": {"gpu": 1}, "idempotency_key": "k"}
    )
    before = await count(conn)
    with pytest.raises(error) as caught:
        await db_batch.create_requests(conn, [one_gpu(), one_gpu(), bad, one_gpu()])
    assert getattr(caught.value, "field", None) == field
    assert str(caught.value).startswith("members[2]: ")
    assert await count(conn) == before  # nothing created, nothing granted
    assert await allocated(conn, "p") == {"gpu": 1, "step_run": 1}
    await assert_healthy(conn)


async def test_batch_size(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 4})
    with pytest.raises(BadInput) as empty:
        await db_batch.create_requests(conn, [])
    assert empty.value.field == "members"
    with pytest.raises(BadInput) as big:
        await db_batch.create_requests(conn, [one_gpu()] * 1001)
    assert big.value.field == "members"
    made = await db_batch.create_requests(conn, [one_gpu(resources={"gpu": 0})] * 1000)
    assert len(made) == 1000 and {m.request.status for m in made} == {"allocated"}
    await assert_healthy(conn)


async def test_multi_pool_members_and_concurrent_batches(db_url: str) -> None:
    """Members naming different pools, in batches that run at once with single creates and
    releases: no deadlock (every batch locks its pools in id order first), no over-allocation."""
    setup = await create_pool(db_url, size=1, application_name=APP_API)
    try:
        async with setup.acquire() as c:
            await mk_pools(c, ("a", "b", "c"), {"gpu": 6}, ("S", "T"))
    finally:
        await setup.close()
    pool = await create_pool(db_url, size=6, application_name=APP_API)
    try:

        async def batch(k: int) -> None:
            order = ["c", "a", "b", None] if k % 2 else [None, "b", "a", "c"]
            members = [
                {"subject": "ST"[k % 2], "pool": name, "resources": {"gpu": 1}} for name in order
            ]
            for _ in range(5):
                made = await db_batch.create_requests(pool, members)
                for m in made:
                    if m.request.status == "allocated":
                        await db_requests.release_request(pool, m.request.id)

        async def single(k: int) -> None:
            for _ in range(10):
                made = await db_requests.create_request(
                    pool, {"subject": "S", "pool": "bc"[k % 2], "resources": {"gpu": 2}}
                )
                await db_requests.release_request(pool, made.request.id)

        await asyncio.wait_for(
            asyncio.gather(*(batch(k) for k in range(4)), *(single(k) for k in range(2))), 120
        )
        async with pool.acquire() as c:
            await assert_healthy(c)
            # every member of every batch and every single create: once each, none lost
            assert await count(c) == 4 * 5 * 4 + 2 * 10
    finally:
        await pool.close()


# The engine itself, without the data layer (which runs a deadlocked call again).
BATCH_SQL = "SELECT member, created, request FROM respool.create_requests($1)"


async def test_batches_naming_the_same_keys_in_another_order_do_not_deadlock(
    db_url: str,
) -> None:
    """Two batches with the same idempotency keys in opposite orders, at once, on real
    connections, for subjects without a policy (no pool lock orders them): the keys are
    claimed in one global order, so one waits for the other and both answer the same
    requests; the database never has to break a deadlock."""
    a = await connect(db_url, application_name=APP_API)
    b = await connect(db_url, application_name=APP_API)
    try:
        for rnd in range(24):
            keys = [f"r{rnd}-k{i}" for i in range(12)]
            members = [{"subject": "nobody", "idempotency_key": k} for k in keys]
            calls = (
                a.fetch(BATCH_SQL, members),
                b.fetch(BATCH_SQL, members[::-1]),
            )
            first, second = await asyncio.wait_for(asyncio.gather(*calls), 60)
            by_key = {r["request"]["idempotency_key"]: r["request"]["id"] for r in first}
            again = {r["request"]["idempotency_key"]: r["request"]["id"] for r in second}
            assert by_key == again and len(by_key) == 12
            assert {r["request"]["status"] for r in first} == {"rejected"}
    finally:
        await a.close()
        await b.close()
