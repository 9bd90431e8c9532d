"""A page of requests (``list_requests``, ``GET /v1/requests``) shows every
request exactly as a read of that request alone does (queue position and blocker message,
starvation hold, earmarks, ETA), while computing each pool once for the whole page.

The queue is mixed: several pools (best_effort with a starvation hold, strict, one with a
preemption grace period and its earmark), several shapes, requests queued in more than one pool,
and requests that are not queued at all.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from engine_support import create_at, db_now, mk_policy, mk_pool, release_at

from app.db import batch as db_batch
from app.db import requests as db_requests
from support.db import function_calls

H = timedelta(hours=1)


async def history(conn: asyncpg.Connection, subject: str, pool: str, start: datetime) -> None:
    """Ten recorded holds of 100 s in ``pool`` (the fewest an ETA is drawn from, so its queued
    requests get one)."""
    for i in range(10):
        r = await create_at(conn, subject, pool, {"gpu": 1}, start + timedelta(seconds=200 * i))
        assert r["status"] == "allocated"
        await release_at(conn, UUID(r["id"]), start + timedelta(seconds=200 * i + 100))


@pytest.fixture
async def mixed(conn: asyncpg.Connection) -> asyncpg.Connection:
    now = await db_now(conn)
    t0 = now - 3 * H
    # "a": best_effort, starvation guard 60 s; the big request waits an hour, so the pool holds.
    await mk_pool(conn, "a", {"gpu": 10}, starvation_seconds=60)
    # "b": strict. "e": a 30 s grace period, for earmarks.
    await mk_pool(conn, "b", {"gpu": 2}, queueing="strict", starvation_seconds=None)
    await mk_pool(conn, "e", {"gpu": 5}, preemption_grace_seconds=30, starvation_seconds=None)
    for subject in ("big", "small"):
        await mk_policy(conn, subject, "a")
    await mk_policy(conn, "multi", "a")
    await mk_policy(conn, "multi", "b", priority=5)
    await mk_policy(conn, "other", "b")
    await mk_policy(conn, "prod", "e", reserved={"gpu": 3})
    await mk_policy(conn, "dev", "e", reserved={"gpu": 2})
    await mk_policy(conn, "ops", "e", priority=10)
    await history(conn, "small", "a", t0)
    await history(conn, "other", "b", t0)
    # a: 7 of 10 GPUs held, the big request starving, small ones behind it held back (one with a
    # max_seconds that ends before the shadow time is not: it is granted), a 2-GPU shape waits.
    for i in range(7):
        r = await create_at(conn, "small", "a", {"gpu": 1}, now - H + timedelta(seconds=i))
        assert r["status"] == "allocated"
    assert (await create_at(conn, "big", "a", {"gpu": 4}, now - H + 10 * timedelta(seconds=1)))[
        "status"
    ] == "queued"
    for i in range(3):
        await create_at(
            conn, "small", "a", {"gpu": 1}, now - 30 * timedelta(minutes=1) + i * H / 100
        )
        await create_at(
            conn, "small", "a", {"gpu": 2}, now - 29 * timedelta(minutes=1) + i * H / 100
        )
    # b: full; multi-pool requests of "multi" (a and b) in two shapes, and b-only ones.
    holder = await create_at(conn, "other", "b", {"gpu": 2}, now - 40 * timedelta(minutes=1))
    assert holder["status"] == "allocated"
    for i in range(3):
        await create_at(
            conn, "multi", None, {"gpu": 1}, now - 20 * timedelta(minutes=1) + i * H / 60
        )
        await create_at(
            conn, "multi", None, {"gpu": 2}, now - 19 * timedelta(minutes=1) + i * H / 60,
            preemptible=False,
        )  # fmt: skip
        await create_at(
            conn, "other", "b", {"gpu": 1}, now - 18 * timedelta(minutes=1) + i * H / 60
        )
    # e: dev holds 2 non-preemptible + 2 preemptible GPUs of 5; prod reclaims 3 (its reserved
    # share): the preemptible holder leaves within its grace period, prod holds the earmark,
    # and a 1-GPU request of ops, which would fit the free unit, waits for the earmark.
    await create_at(
        conn, "dev", "e", {"gpu": 2}, now - 50 * timedelta(minutes=1), preemptible=False
    )
    await create_at(conn, "dev", "e", {"gpu": 2}, now - 49 * timedelta(minutes=1))
    prod = await create_at(conn, "prod", "e", {"gpu": 3}, now - 48 * timedelta(minutes=1))
    pool_e = await conn.fetchval("SELECT id FROM respool.pools WHERE name = 'e'")
    await conn.execute(
        "SELECT respool.reconcile_pool($1, $2)", pool_e, now - 47 * timedelta(minutes=1)
    )
    assert (await conn.fetchval("SELECT respool.request_json($1)", UUID(prod["id"])))[
        "status"
    ] == "queued"
    await create_at(conn, "ops", "e", {"gpu": 1}, now - 46 * timedelta(minutes=1))
    # Not queued: released and rejected requests on the same page.
    done = await create_at(conn, "small", "a", {"gpu": 11}, now - 45 * timedelta(minutes=1))
    assert done["status"] == "rejected"
    return conn


async def _single(conn: asyncpg.Connection, request_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = await conn.fetchval("SELECT respool.get_request($1)", UUID(request_id))
    return doc


@pytest.mark.parametrize(
    "filters",
    [{}, {"p_status": "queued"}, {"p_pool": "a"}, {"p_pool": "e", "p_status": "queued"}],
    ids=["all", "queued", "pool-a", "pool-e-queued"],
)
async def test_a_page_shows_each_request_as_its_own_read_does(
    mixed: asyncpg.Connection, filters: dict[str, str]
) -> None:
    conn = mixed
    async with conn.transaction():  # one now() for the page and the single reads
        args = ", ".join(f"{k} => ${i + 1}" for i, k in enumerate(filters))
        page: list[dict[str, Any]] = await conn.fetchval(
            f"SELECT respool.list_requests({args}{', ' if args else ''}p_limit => 1000)",
            *filters.values(),
        )
        assert page
        for item in page:
            assert item == await _single(conn, item["id"]), item["id"]
    if filters:
        return
    # The page covered every case it is meant to: the starvation hold, the earmark (both
    # sides), the strict pool, several pools at once, positions behind others and ETAs.
    messages = [i["message"] for i in page if i["status"] == "queued"]
    for part in (
        "held: pool reserves gpu for an earlier request",
        "waiting: freed units are earmarked",
        "preempted units are being released for it",
        "waiting for gpu: pool",
        " | ",
        "ahead",
    ):
        assert any(part in m for m in messages), (part, messages)
    assert any(i["eta"] is not None for i in page)
    assert any(i["eta"] is None for i in page if i["status"] == "queued")
    assert {"queued", "allocated", "released", "rejected", "preempting"} <= {
        i["status"] for i in page
    }


async def test_queued_gang_members_on_a_page_read_as_their_own_reads(
    mixed: asyncpg.Connection,
) -> None:
    """A gang waits as one request of the members' sum at its first member's place;
    each member's position, message and ETA on a page are what its own read says."""
    conn = mixed
    members = [{"subject": "small", "pool": "a", "resources": {"gpu": 2}}] * 3
    made = await db_batch.create_requests(conn, members, all_or_nothing=True)
    ids = {str(m.request.id) for m in made}
    async with conn.transaction():
        page: list[dict[str, Any]] = await conn.fetchval(
            "SELECT respool.list_requests(p_pool => 'a', p_status => 'queued', p_limit => 1000)"
        )
        mine = [item for item in page if item["id"] in ids]
        assert len(mine) == 3
        for item in mine:
            assert item == await _single(conn, item["id"]), item["id"]
    assert {(i["queue_position"], i["message"]) for i in mine} == {
        (mine[0]["queue_position"], mine[0]["message"])
    }
    assert mine[0]["message"].startswith(f"gang {mine[0]['gang_id']}: ")


async def test_reading_one_gang_member_works_on_its_gang_only(mixed: asyncpg.Connection) -> None:
    """Reading some requests computes the gang stand-in of those asked for, not of every queued
    gang member in the database (a batch answers through this read)."""
    conn = mixed
    members = [{"subject": "small", "pool": "a", "resources": {"gpu": 2}}] * 2
    gangs = [await db_batch.create_requests(conn, members, all_or_nothing=True) for _ in range(10)]
    await conn.execute("SET track_functions = 'all'")
    async with conn.transaction():
        docs = await conn.fetch(
            "SELECT doc FROM respool.request_docs($1)", [gangs[0][0].request.id]
        )
        assert len(docs) == 1
        assert await function_calls(conn, "respool._queued_as(uuid)") == 1


async def test_the_api_list_and_single_reads_agree(mixed: asyncpg.Connection) -> None:
    async with mixed.transaction():
        listed = await db_requests.list_requests(mixed, status="queued", limit=1000)
        assert listed
        for r in listed:
            assert r == await db_requests.get_request(mixed, r.id)


async def test_many_requests_read_at_once_agree_with_single_reads(
    mixed: asyncpg.Connection,
) -> None:
    """The long-polls' batched answer read (``get_requests``): each request as
    its own read gives it, gang members included; unknown ids are left out."""
    conn = mixed
    members = [{"subject": "small", "pool": "a", "resources": {"gpu": 2}}] * 2
    await db_batch.create_requests(conn, members, all_or_nothing=True)
    ids = [r["id"] for r in await conn.fetch("SELECT id FROM respool.requests")]
    async with conn.transaction():
        found = await db_requests.get_requests(conn, [*ids, uuid4()])
        assert set(found) == set(ids)
        for rid in ids:
            assert found[rid] == await db_requests.get_request(conn, rid), rid
    assert any(r.gang_id and r.status == "queued" for r in found.values())
    assert any(r.eta for r in found.values()) and any(r.queue_position for r in found.values())


async def test_a_page_computes_once_per_pool_and_shape(mixed: asyncpg.Connection) -> None:
    conn = mixed
    await conn.execute("SET track_functions = 'all'")
    async with conn.transaction():
        page = await conn.fetchval("SELECT respool.list_requests(p_limit => 1000)")
        queued = [UUID(i["id"]) for i in page if i["status"] == "queued"]
        entries = await conn.fetch(
            "SELECT e.pool_id, e.policy_id, r.resources, r.preemptible FROM respool.queue_entries e"
            " JOIN respool.requests r ON r.id = e.request_id WHERE e.request_id = ANY ($1)",
            queued,
        )
        pools = len({e["pool_id"] for e in entries})
        shapes = len({(e["pool_id"], e["policy_id"], str(e["resources"]), e["preemptible"])
                      for e in entries})  # fmt: skip
        assert len(queued) > shapes > pools == 3
        per_pool = {
            "respool._queue_positions(uuid, uuid[])": pools,
            "respool._eta_pool(uuid, timestamp with time zone, uuid)": pools,
            "respool._pool_hold(uuid, timestamp with time zone)": pools,
            "respool._blocker(jsonb, boolean, uuid, uuid)": shapes,
        }
        per_request = (
            "respool._queue_position(uuid, uuid)",
            "respool._queue_order(uuid)",  # positions without sorting a whole queue
            "respool._request_eta(uuid, timestamp with time zone)",
            "respool._eta(uuid, uuid, timestamp with time zone)",
            "respool._held_back(uuid, respool.requests, timestamp with time zone,"
            " respool.pool_hold)",
            "respool._earmark_blocks(respool.requests, uuid)",
            "respool._request_json(uuid)",
        )
        seen = {f: await function_calls(conn, f) for f in (*per_pool, *per_request)}
        assert seen == per_pool | dict.fromkeys(per_request, 0)


async def test_positions_with_equal_queue_times_across_shapes_and_classes(
    conn: asyncpg.Connection,
) -> None:
    """A page's positions (``respool._queue_positions``: binary search per shape, no sort) are
    the whole queue order's and a single read's, also when requests of several shapes are queued
    at the same instant (the id decides) and the shapes are in different classes: priority,
    in-share, dominant share (a fair pool)."""
    now = await db_now(conn)
    await mk_pool(conn, "f", {"gpu": 4}, ordering="fair", starvation_seconds=None)
    await mk_policy(conn, "hi", "f", priority=5)
    await mk_policy(conn, "res", "f", reserved={"gpu": 2})
    for subject in ("lo", "lo2"):
        await mk_policy(conn, subject, "f")
    for subject, gpu in (("lo", 3), ("lo2", 1)):  # full; lo's dominant share is the larger
        assert (await create_at(conn, subject, "f", {"gpu": gpu}, now - 2 * H))[
            "status"
        ] == "allocated"
    for k in range(3):
        at = now - H + k * timedelta(minutes=1)
        for subject in ("lo", "lo2", "res", "hi"):
            for gpu in (1, 2):
                for _ in range(2):
                    made = await create_at(conn, subject, "f", {"gpu": gpu}, at)
                    assert made["status"] == "queued"
    pool_id = await conn.fetchval("SELECT id FROM respool.pools WHERE name = 'f'")
    async with conn.transaction():
        rows = await conn.fetch(
            "SELECT o.request_id, o.position, o.priority, o.in_share, e.queued_at"
            "  FROM respool._queue_order($1) o"
            "  JOIN respool.queue_entries e ON e.request_id = o.request_id AND e.pool_id = $1",
            pool_id,
        )
        order = {r["request_id"]: r["position"] for r in rows}
        assert len(order) == 48
        assert len({r["queued_at"] for r in rows}) == 3  # 16 requests queued at each instant
        assert len({(r["priority"], r["in_share"]) for r in rows}) == 3
        page = await conn.fetchval(
            "SELECT respool.list_requests(p_status => 'queued', p_limit => 1000)"
        )
        assert sorted(i["queue_position"] for i in page) == list(range(1, 49))
        for item in page:
            assert item["queue_position"] == order[UUID(item["id"])]
            assert item == await _single(conn, item["id"])
        # Any subset: only the requests asked for, with the same numbers.
        some = [UUID(i["id"]) for i in page[::5]]
        got = await conn.fetch("SELECT * FROM respool._queue_positions($1, $2)", pool_id, some)
        assert {r["request_id"]: r["position"] for r in got} == {i: order[i] for i in some}
