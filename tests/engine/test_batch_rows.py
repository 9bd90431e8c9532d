"""Creates that each stand alone in one call (what the API makes of concurrent single creates,
docs/api.md "Coalesced creates"): the engine answers one row per member, a refused member's row
carrying the code, field and message its single create raises, and that member changes nothing
while the others are created as their single creates would be, in order."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec
import pytest
from engine_support import allocated, assert_healthy, events, mk_policy, mk_pool, queue_ids
from respool_client.wire import Created

from app.db import batch as db_batch
from app.db import requests as db_requests
from app.db.errors import BadInput, EngineError, IdempotencyMismatch, NotFound


def one_gpu(**kw: Any) -> dict[str, Any]:
    return {"subject": "S", "pool": "p", "resources": {"gpu": 1}, **kw}


def raw(doc: Any) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(doc))


async def each(conn: asyncpg.Connection, members: list[Any]) -> list[Created | EngineError]:
    return await db_batch.create_requests_each(conn, raw(members))


async def single_error(conn: asyncpg.Connection, body: Any) -> EngineError:
    """The error the single create of ``body`` raises (it changes nothing)."""
    with pytest.raises(EngineError) as caught:
        await db_requests.create_request(conn, raw(body))
    return caught.value


def same_error(got: Created | EngineError, expected: EngineError) -> None:
    assert isinstance(got, EngineError), got
    assert type(got) is type(expected)
    assert (got.message, got.field) == (expected.message, expected.field)
    assert "members[" not in got.message + (got.field or "")


async def count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM respool.requests"))


async def event_count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM respool.events"))


def made(results: list[Created | EngineError]) -> list[Created]:
    return [r for r in results if isinstance(r, Created)]


async def pool_p(conn: asyncpg.Connection, gpus: int, **kw: Any) -> None:
    await mk_pool(conn, "p", {"gpu": gpus}, **kw)
    await mk_policy(conn, "S", "p")


@pytest.mark.parametrize(
    ("bad", "error", "field"),
    [
        ({"subject": "S", "resources": {"GPU": 1}}, BadInput, "resources.GPU"),
        ({"subject": "S", "resources": {"gpu": -1}}, BadInput, "resources.gpu"),
        ({"subject": "bad subject"}, BadInput, "subject"),
        ({"subject": "S", "colour": "red"}, BadInput, "colour"),
        ({"subject": "S", "labels": {"a": 1}}, BadInput, "labels.a"),
        ({"subject": "S", "pool": "nope"}, NotFound, "pool"),
        ("not an object", BadInput, None),
        (
            one_gpu(resources={"gpu": 2}, idempotency_key="k"),
            IdempotencyMismatch,
            "idempotency_key",
        ),
    ],
)
async def test_a_refused_member_gets_its_single_creates_error_and_the_others_are_made(
    conn: asyncpg.Connection, bad: Any, error: type[EngineError], field: str | None
) -> None:
    await pool_p(conn, 4)
    await db_requests.create_request(conn, one_gpu(idempotency_key="k"))
    expected = await single_error(conn, bad)
    assert type(expected) is error and expected.field == field
    before, events_before = await count(conn), await event_count(conn)

    rows = await each(
        conn,
        [one_gpu(labels={"i": "0"}), one_gpu(labels={"i": "1"}), bad, one_gpu(labels={"i": "3"})],
    )

    assert len(rows) == 4
    same_error(rows[2], expected)
    docs = made(rows)
    assert [c.created for c in docs] == [True] * 3
    assert [c.request.labels for c in docs] == [{"i": "0"}, {"i": "1"}, {"i": "3"}]
    assert [c.request.status for c in docs] == ["allocated"] * 3
    # the refused member left nothing: three requests and their two events each (queued,
    # allocated), no more
    assert await count(conn) == before + 3
    assert await event_count(conn) == events_before + 6
    assert await allocated(conn, "p") == {"gpu": 4, "step_run": 4}
    await assert_healthy(conn)


async def test_each_member_is_made_after_the_ones_before_it(conn: asyncpg.Connection) -> None:
    """A key first used in the same call: its mismatch is refused, its retry answers it."""
    await pool_p(conn, 1)
    body = one_gpu(idempotency_key="x", labels={"first": "yes"})
    other = one_gpu(idempotency_key="x", labels={"first": "no"})

    rows = await each(conn, [body, other, body, one_gpu(labels={"i": "3"})])

    first, refused, retry, last = rows
    assert isinstance(first, Created) and isinstance(retry, Created)
    assert isinstance(last, Created)
    assert (first.created, retry.created) == (True, False)
    assert retry.request.id == first.request.id
    # exactly what the mismatching single create raises now that the first exists
    same_error(refused, await single_error(conn, other))
    assert isinstance(refused, IdempotencyMismatch)
    assert first.request.status == "allocated" and last.request.status == "queued"
    assert last.request.queue_position == 1
    assert await count(conn) == 2
    assert await events(conn, first.request.id) == [
        (None, "queued", None),
        ("queued", "allocated", None),
    ]
    await assert_healthy(conn)


@pytest.mark.parametrize("queueing", ["best_effort", "strict"])
async def test_refused_members_anywhere_leave_the_others_in_order(
    conn: asyncpg.Connection, queueing: str
) -> None:
    """Refused first, last and side by side; in a strict pool (members made one by one) too."""
    await pool_p(conn, 2, queueing=queueing)
    unknown = one_gpu(pool="nope")
    bad = {"subject": "S", "resources": {"gpu": -1}}
    expected = {
        id(unknown): await single_error(conn, unknown),
        id(bad): await single_error(conn, bad),
    }
    members = [
        unknown,
        one_gpu(labels={"i": "1"}),
        bad,
        unknown,
        one_gpu(labels={"i": "4"}),
        one_gpu(labels={"i": "5"}),
        one_gpu(labels={"i": "6"}),
        bad,
    ]

    rows = await each(conn, members)

    for member, row in zip(members, rows, strict=True):
        if id(member) in expected:
            same_error(row, expected[id(member)])
        else:
            assert isinstance(row, Created)
    docs = made(rows)
    assert [c.request.labels["i"] for c in docs] == ["1", "4", "5", "6"]
    assert [c.request.status for c in docs] == ["allocated", "allocated", "queued", "queued"]
    assert [c.request.queue_position for c in docs[2:]] == [1, 2]
    assert await queue_ids(conn, "p") == [docs[2].request.id, docs[3].request.id]
    assert await count(conn) == 4
    await assert_healthy(conn)


async def test_all_refused_or_all_made(conn: asyncpg.Connection) -> None:
    await pool_p(conn, 8)
    unknown = one_gpu(pool="nope")
    expected = await single_error(conn, unknown)
    for row in await each(conn, [unknown, unknown]):
        same_error(row, expected)
    assert await count(conn) == 0
    rows = await each(conn, [one_gpu(), one_gpu()])
    assert [getattr(r, "created", None) for r in rows] == [True, True]
    with pytest.raises(BadInput) as empty:
        await each(conn, [])
    assert empty.value.field == "members"
    await assert_healthy(conn)
