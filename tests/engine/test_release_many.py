"""Several releases in one transaction (what the API makes of concurrent release calls): each
ends its request as its own release call would, in order, and an unknown id or a stale attempt
is that release's error alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest
from engine_support import (
    assert_healthy,
    events,
    mk_pool_s,
    mk_pools,
    mk_req,
    queue_ids,
    status,
)
from respool_client.wire import Request

from app.db import requests as db_requests
from app.db.connect import APP_API, create_pool
from app.db.errors import Conflict, NotFound
from support.db import function_calls


@pytest.fixture(autouse=True)
async def healthy_after(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """Every test leaves the engine's invariants whole."""
    yield
    await assert_healthy(conn)


async def mk(conn: asyncpg.Connection, gpus: int) -> Request:
    """A request of S for ``gpus`` GPUs in pool p."""
    return await mk_req(conn, "S", "p", resources={"gpu": gpus})


async def pool_with(conn: asyncpg.Connection, capacity: int, *gpus: int) -> list[Request]:
    """Pool p of ``capacity`` GPUs, then a request of S for each of ``gpus``, in order."""
    await mk_pool_s(conn, {"gpu": capacity})
    return [await mk(conn, n) for n in gpus]


def field_of(done: Sequence[object], name: str) -> list[object]:
    """Each release's ``name`` (status, id, ...); None for a release that failed."""
    return [getattr(d, name, None) for d in done]


async def test_each_release_ends_its_request_and_the_freed_units_go_to_the_queue(
    conn: asyncpg.Connection,
) -> None:
    a, b, waiting = await pool_with(conn, 2, 1, 1, 2)
    assert waiting.status == "queued"

    done = await db_requests.release_requests(conn, [(a.id, None), (b.id, a.attempt)])

    assert field_of(done, "status") == ["released", "released"]
    assert field_of(done, "id") == [a.id, b.id]
    # both gave their units back in that one transaction: the 2-GPU request holds them now
    assert await status(conn, waiting.id) == "allocated"
    assert await queue_ids(conn, "p") == []
    assert await events(conn, a.id) == [
        (None, "queued", None),
        ("queued", "allocated", None),
        ("allocated", "released", None),
    ]


async def test_an_unknown_id_or_a_stale_attempt_fails_that_release_only(
    conn: asyncpg.Connection,
) -> None:
    a, b, c = await pool_with(conn, 4, 1, 1, 1)
    unknown = uuid.uuid4()

    done = await db_requests.release_requests(
        conn, [(a.id, None), (unknown, None), (b.id, b.attempt + 1), (c.id, c.attempt)]
    )

    assert getattr(done[0], "status", None) == "released"
    assert isinstance(done[1], NotFound) and done[1].field == "id"
    assert str(unknown) in done[1].message
    assert isinstance(done[2], Conflict) and done[2].field == "attempt"
    assert "stale attempt" in done[2].message
    assert getattr(done[3], "status", None) == "released"
    # the refused release changed nothing; the others did their work
    assert await status(conn, b.id) == "allocated"
    assert [await status(conn, r.id) for r in (a, c)] == ["released", "released"]


async def test_a_queued_request_is_cancelled_and_a_finished_one_left_as_it_is(
    conn: asyncpg.Connection,
) -> None:
    holder, waiting = await pool_with(conn, 1, 1, 1)

    done = await db_requests.release_requests(
        conn, [(waiting.id, None), (holder.id, None), (holder.id, None)]
    )

    assert field_of(done, "status") == ["cancelled", "released", "released"]
    assert getattr(done[0], "reason", None) == "released_while_queued"
    # released once: the second mention of it found it finished and left it so
    assert [e[1] for e in await events(conn, holder.id)].count("released") == 1


async def test_concurrent_batches_over_the_same_requests_never_deadlock_or_double_free(
    conn: asyncpg.Connection, db_url: str
) -> None:
    made = await pool_with(conn, 40, *[1] * 40)
    ids = [r.id for r in made]
    pool = await create_pool(db_url, size=4, application_name=APP_API)
    try:
        # four connections releasing overlapping sets in opposite orders at once, each in a
        # transaction of its own (so a deadlock would fail the call, not be run again)
        batches = [ids[:30], ids[10:][::-1], ids[::2], ids[::-3]]

        async def release(batch: list[uuid.UUID]) -> list[object]:
            async with pool.acquire() as c, c.transaction():
                return list(await db_requests.release_requests(c, [(i, None) for i in batch]))

        results = await asyncio.gather(*(release(b) for b in batches))
    finally:
        await pool.close()
    assert all(getattr(d, "status", None) == "released" for r in results for d in r)
    for r in made:
        assert [e[1] for e in await events(conn, r.id)].count("released") == 1


async def _ended(conn: asyncpg.Connection, pool: str) -> dict[str, Any]:
    """What a user or operator sees of pool ``pool`` once its requests ended, each request named
    by its label: status, version, reason and message, its events (from, to, reason, attempt,
    message), its charges, and the pool's and policies' counters."""
    rows = await conn.fetch(
        "SELECT r.labels ->> 'm' AS m, r.status, r.version, r.reason, r.message,"
        " r.np_charge::text, r.lease_expires_at IS NULL AS no_lease,"
        " r.finished_at IS NOT NULL AS finished,"
        " (SELECT array_agg(ROW(e.from_status, e.to_status, e.reason, e.attempt,"
        "                       e.message)::text ORDER BY e.id)"
        "    FROM respool.events e WHERE e.request_id = r.id) AS events,"
        " (SELECT array_agg(ROW(c.key, c.estimate, c.amount, c.settled_at IS NOT NULL,"
        "                       c.counted)::text ORDER BY c.key)"
        "    FROM respool.rate_charges c WHERE c.request_id = r.id) AS charges"
        " FROM respool.requests r WHERE r.pool_name = $1 ORDER BY m",
        pool,
    )
    counters = await conn.fetch(
        "SELECT 'pool', NULL, pr.key, pr.used, NULL::bigint FROM respool.pool_resources pr"
        "  JOIN respool.pools p ON p.id = pr.pool_id WHERE p.name = $1"
        " UNION ALL SELECT 'policy', po.subject, r.key, r.used, r.np_used"
        "  FROM respool.policy_resources r JOIN respool.policies po ON po.id = r.policy_id"
        "  JOIN respool.pools p ON p.id = po.pool_id WHERE p.name = $1 ORDER BY 1, 2, 3",
        pool,
    )
    return {"requests": [dict(r) for r in rows], "counters": [tuple(c) for c in counters]}


@pytest.mark.parametrize("queue", [False, True])
async def test_a_batch_of_settlements_leaves_what_one_release_after_another_leaves(
    conn: asyncpg.Connection, queue: bool
) -> None:
    """Reservations of three teams on a rate key and a GPU, released together with settlements
    below, at and above their estimates (and one without): the same requests, events, charges
    and counters as releasing them one after another. ``queue``: a request waits in the pool."""
    rates = {"tok": {"amount": 100_000, "per_seconds": 3600}}
    await mk_pools(conn, ("one", "many"), {"gpu": 8}, ("a", "b", "c"), rates=rates)
    made: dict[str, list[Request]] = {"one": [], "many": []}
    for pool in ("one", "many"):
        for i, team in enumerate("abcabc"):
            body = {"gpu": 1, "tok": 1000 * (i + 1)}
            made[pool].append(await mk_req(conn, team, pool, resources=body, labels={"m": str(i)}))
        if queue:
            await mk_req(conn, "a", pool, resources={"gpu": 4}, labels={"m": "waits"})
    used: list[dict[str, int] | None] = [
        {"tok": 500},
        {"tok": 2000},
        {"tok": 3300},
        None,
        {"tok": 0},
        {"tok": 6000},
    ]
    for r, u in zip(made["one"], used, strict=True):
        await db_requests.release_request(conn, r.id, used=u)
    await conn.execute("SET track_functions = 'all'")
    async with conn.transaction():
        done = await db_requests.release_requests(
            conn, [(r.id, r.attempt, u) for r, u in zip(made["many"], used, strict=True)]
        )
        # (with nobody waiting, the settlements were made together; else one by one)
        together = await function_calls(conn, "respool._settle_many(uuid[], jsonb[], timestamptz)")
    assert together == (0 if queue else 1)
    assert field_of(done, "status") == ["released"] * 6
    one, many = await _ended(conn, "one"), await _ended(conn, "many")
    assert many == one
    assert [r["status"] for r in one["requests"]] == ["released"] * 6 + (
        ["allocated"] if queue else []
    )


ONE_SHAPE = [("a", {"gpu": 1})] * 3
WAITERS = {
    # (waiters' subject and resources in queue order, whether the batch ends set-based)
    "one shape": (ONE_SHAPE, True),
    "one shape, more than the units freed": ([("a", {"gpu": 1})] * 6, True),
    "two shapes": ([("a", {"gpu": 2}), ("a", {"gpu": 1}), ("a", {"gpu": 1})], False),
    "two subjects": ([("a", {"gpu": 1}), ("b", {"gpu": 1}), ("a", {"gpu": 1})], False),
}


@pytest.mark.parametrize("case", list(WAITERS))
async def test_a_batch_with_waiters_leaves_what_one_release_after_another_leaves(
    conn: asyncpg.Connection, case: str
) -> None:
    """Holders of team h (2 GPUs, 1 GPU, 1 GPU) fill a pool of 4 GPUs with requests waiting;
    the two of 1 GPU are released together: the same requests granted, events and counters as
    releasing them one after another. Waiters of one team and one shape are granted by one pass
    after both ends; any other queue is ended one by one (with two shapes, one pass after both
    would grant the 2-GPU head where a pass after each end grants the 1-GPU requests behind it)."""
    waiters, set_based = WAITERS[case]
    await mk_pools(conn, ("one", "many"), {"gpu": 4}, ("h", "a", "b"))
    made: dict[str, list[Request]] = {"one": [], "many": []}
    for pool in ("one", "many"):
        for i, gpus in enumerate((2, 1, 1)):
            made[pool].append(
                await mk_req(conn, "h", pool, resources={"gpu": gpus}, labels={"m": f"h{i}"})
            )
        for i, (team, body) in enumerate(waiters):
            waiting = await mk_req(conn, team, pool, resources=body, labels={"m": f"w{i}"})
            assert waiting.status == "queued"
    for r in made["one"][1:]:
        await db_requests.release_request(conn, r.id)
    await conn.execute("SET track_functions = 'all'")
    async with conn.transaction():
        done = await db_requests.release_requests(
            conn, [(r.id, r.attempt) for r in made["many"][1:]]
        )
        one_by_one = await function_calls(
            conn, "respool._end_locked(uuid, text, text, text, text, text, timestamptz)"
        )
    assert one_by_one == (0 if set_based else 2)
    assert field_of(done, "status") == ["released"] * 2
    one, many = await _ended(conn, "one"), await _ended(conn, "many")
    assert many == one
    granted = [r["m"] for r in one["requests"] if r["status"] == "allocated"]
    assert granted, "the freed units went to the queue"
