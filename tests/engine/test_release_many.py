"""Several releases in one transaction (what the API makes of concurrent release calls): each
ends its request as its own release call would, in order, and an unknown id or a stale attempt
is that release's error alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from engine_support import assert_healthy, events, mk_pool_s, mk_req, queue_ids, status
from respool_client.wire import Request

from app.db import requests as db_requests
from app.db.connect import APP_API, create_pool
from app.db.errors import Conflict, NotFound


@pytest.fixture(autouse=True)
async def healthy_after(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """Every test leaves the engine's invariants whole."""
    yield
    await assert_healthy(conn)


async def mk(conn: asyncpg.Connection, gpus: int) -> Request:
    """A request of S for ``gpus`` GPUs in pool p."""
    return await mk_req(conn, "S", "p", resources={"gpu": gpus})


async def test_each_release_ends_its_request_and_the_freed_units_go_to_the_queue(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool_s(conn, {"gpu": 2})
    a = await mk(conn, 1)
    b = await mk(conn, 1)
    waiting = await mk(conn, 2)
    assert waiting.status == "queued"

    done = await db_requests.release_requests(conn, [(a.id, None), (b.id, a.attempt)])

    assert [getattr(d, "status", None) for d in done] == ["released", "released"]
    assert [getattr(d, "id", None) for d in done] == [a.id, b.id]
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
    await mk_pool_s(conn, {"gpu": 4})
    a = await mk(conn, 1)
    b = await mk(conn, 1)
    c = await mk(conn, 1)
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
    await mk_pool_s(conn, {"gpu": 1})
    holder = await mk(conn, 1)
    waiting = await mk(conn, 1)

    done = await db_requests.release_requests(
        conn, [(waiting.id, None), (holder.id, None), (holder.id, None)]
    )

    assert [getattr(d, "status", None) for d in done] == ["cancelled", "released", "released"]
    assert getattr(done[0], "reason", None) == "released_while_queued"
    # released once: the second mention of it found it finished and left it so
    assert [e[1] for e in await events(conn, holder.id)].count("released") == 1


async def test_concurrent_batches_over_the_same_requests_never_deadlock_or_double_free(
    conn: asyncpg.Connection, db_url: str
) -> None:
    await mk_pool_s(conn, {"gpu": 40})
    made = [await mk(conn, 1) for _ in range(40)]
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
