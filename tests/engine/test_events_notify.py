"""Every status change leaves an event row, bumps `version` and sends a NOTIFY at commit, except
the changes a create makes to its own request: nobody can wait for it before the create answers
(docs/engine.md, "No notification for a create's own changes"), so those are in its history
and its answer only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from engine_support import events, get, mk_pool_s, mk_pools_s, mk_req, pool_id

from app.db import pools as db_pools
from app.db import requests as db_requests

Ev = tuple[str | None, str, str | None]


async def _release(conn: asyncpg.Connection) -> list[Ev]:
    r = await mk_req(conn, "S", "p", resources={"gpu": 1})
    await db_requests.release_request(conn, r.id)
    return await events(conn, r.id)


async def _cancel_queued(conn: asyncpg.Connection) -> list[Ev]:
    await mk_req(conn, "S", "p", resources={"gpu": 2})
    r = await mk_req(conn, "S", "p", resources={"gpu": 2})
    await db_requests.cancel_request(conn, r.id)
    return await events(conn, r.id)


async def _release_queued(conn: asyncpg.Connection) -> list[Ev]:
    await mk_req(conn, "S", "p", resources={"gpu": 2})
    r = await mk_req(conn, "S", "p", resources={"gpu": 2})
    await db_requests.release_request(conn, r.id)
    return await events(conn, r.id)


async def _cancel_allocated(conn: asyncpg.Connection) -> list[Ev]:
    r = await mk_req(conn, "S", "p", resources={"gpu": 1})
    await db_requests.cancel_request(conn, r.id)
    return await events(conn, r.id)


async def _reject(conn: asyncpg.Connection) -> list[Ev]:
    return await events(conn, (await mk_req(conn, "S", "p", resources={"gpu": 3})).id)


async def _wait_then_grant(conn: asyncpg.Connection) -> list[Ev]:
    first = await mk_req(conn, "S", "p", resources={"gpu": 2})
    r = await mk_req(conn, "S", "p", resources={"gpu": 2})
    await db_requests.release_request(conn, first.id)
    return await events(conn, r.id)


async def _expire(conn: asyncpg.Connection) -> list[Ev]:
    r = await mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=5)
    assert r.lease_expires_at is not None
    await conn.fetchval(
        "SELECT respool.expire_leases(p_pool_id => $1, p_now => $2)",
        await pool_id(conn, "p"),
        r.lease_expires_at + timedelta(seconds=1),
    )
    return await events(conn, r.id)


async def _shrink(conn: asyncpg.Connection) -> list[Ev]:
    await mk_req(conn, "S", "p", resources={"gpu": 2})
    r = await mk_req(conn, "S", "p", resources={"gpu": 2})
    await db_pools.update_pool(conn, "p", capacity={"gpu": 1})
    return await events(conn, r.id)


async def _pool_deleted(conn: asyncpg.Connection) -> list[Ev]:
    r = await mk_req(conn, "S", "p", resources={"gpu": 1})
    await db_pools.delete_pool(conn, "p", force=True)
    return await events(conn, r.id)


QUEUED: Ev = (None, "queued", None)
GRANTED: list[Ev] = [QUEUED, ("queued", "allocated", None)]


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        (_release, [*GRANTED, ("allocated", "released", None)]),
        (_cancel_allocated, [*GRANTED, ("allocated", "cancelled", "cancelled")]),
        (_cancel_queued, [QUEUED, ("queued", "cancelled", "cancelled")]),
        (_release_queued, [QUEUED, ("queued", "cancelled", "released_while_queued")]),
        (_reject, [(None, "rejected", "exceeds_capacity")]),
        (_wait_then_grant, GRANTED),
        (_expire, [*GRANTED, ("allocated", "expired", "lease_expired")]),
        (_shrink, [QUEUED, ("queued", "rejected", "exceeds_capacity")]),
        (_pool_deleted, [*GRANTED, ("allocated", "cancelled", "pool_deleted")]),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else "",
)
async def test_history(
    conn: asyncpg.Connection,
    scenario: Callable[[asyncpg.Connection], Awaitable[list[Ev]]],
    expected: list[Ev],
) -> None:
    await mk_pool_s(conn, {"gpu": 2})
    history = await scenario(conn)
    assert history == expected
    # version counts the status changes; the view shows the same history
    rid = await conn.fetchval("SELECT request_id FROM respool.events ORDER BY id DESC LIMIT 1")
    r = await get(conn, rid)
    assert r.version == len(expected) and r.status == expected[-1][1]
    assert await conn.fetchval(
        "SELECT count(*) FROM respool.request_events WHERE request_id = $1", rid
    ) == len(expected)
    full = await db_requests.request_events(conn, rid)
    assert all(e.attempt == 1 and e.at is not None for e in full)


async def test_events_are_append_only(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 2})
    await mk_req(conn, "S", "p")
    with pytest.raises(asyncpg.PostgresError) as err:
        await conn.execute("UPDATE respool.events SET reason = 'x'")
    assert err.value.sqlstate == "RP500"


# --- NOTIFY ------------------------------------------------------------------------------------


class Notes(asyncio.Queue[dict[str, Any]]):
    """Payloads received on channel respool_request by a LISTEN connection of its own."""

    listener: asyncpg.Connection


@pytest.fixture
async def notes(db_url: str) -> AsyncIterator[Notes]:
    received = Notes()
    received.listener = await asyncpg.connect(db_url)

    def on_note(_c: object, _pid: int, channel: str, payload: str) -> None:
        assert channel == "respool_request"
        received.put_nowait(json.loads(payload))

    await received.listener.add_listener("respool_request", on_note)
    try:
        yield received
    finally:
        await received.listener.close()


def note(
    request_id: object,
    status: str,
    version: int,
    pool: str | None,
    frm: str | None,
    *,
    subject: str = "S",
    reason: str | None = None,
    attempt: int = 1,
) -> dict[str, Any]:
    """The respool_request payload of one status change."""
    return {
        "id": str(request_id),
        "status": status,
        "version": version,
        "pool": pool,
        "subject": subject,
        "from": frm,
        "reason": reason,
        "attempt": attempt,
    }


async def take(notes: Notes, n: int) -> list[dict[str, Any]]:
    return [await asyncio.wait_for(notes.get(), timeout=5) for _ in range(n)]


async def nothing_more(notes: Notes) -> None:
    """Nothing was notified by what committed so far: a sentinel notified now (committed after
    it) is the next payload to arrive, since PostgreSQL delivers notifications in commit order."""
    sentinel = {"id": str(uuid4()), "sentinel": True}
    await notes.listener.execute("SELECT pg_notify('respool_request', $1)", json.dumps(sentinel))
    assert await take(notes, 1) == [sentinel]


async def test_notify_after_commit(conn: asyncpg.Connection, notes: Notes) -> None:
    await mk_pool_s(conn, {"gpu": 1})
    r = await mk_req(conn, "S", "p", resources={"gpu": 1})
    rid = str(r.id)
    # created and granted in one call: its answer says so, nobody else can be waiting for it
    assert (r.status, r.version) == ("allocated", 2)
    await nothing_more(notes)

    # inside a transaction: nothing until commit
    async with conn.transaction():
        await db_requests.release_request(conn, r.id)
        await nothing_more(notes)
    assert await take(notes, 1) == [note(rid, "released", 3, "p", "allocated")]

    # a heartbeat or a read is not a status change
    await db_requests.heartbeat_request(conn, r.id)
    await db_requests.get_request(conn, r.id)
    await nothing_more(notes)


async def test_no_notify_for_a_rolled_back_transaction(
    conn: asyncpg.Connection, notes: Notes
) -> None:
    await mk_pool_s(conn, {"gpu": 1})
    r = await mk_req(conn, "S", "p", resources={"gpu": 1})

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with conn.transaction():
            assert (await db_requests.release_request(conn, r.id)).status == "released"
            raise Abort
    await nothing_more(notes)
    assert (await get(conn, r.id)).status == "allocated"


async def test_notify_names_the_pool_once_granted(conn: asyncpg.Connection, notes: Notes) -> None:
    await mk_pools_s(conn, {"gpu": 1}, "a", "b")
    holder = await mk_req(conn, "S", "b", resources={"gpu": 1})
    await mk_req(conn, "S", "a", resources={"gpu": 1})
    waiting = await mk_req(conn, "S", resources={"gpu": 1})
    assert (waiting.status, waiting.pool) == ("queued", None)
    await nothing_more(notes)  # three creates, none announced
    await db_requests.release_request(conn, holder.id)
    got = await take(notes, 2)
    assert got == [
        note(holder.id, "released", 3, "b", "allocated"),
        note(waiting.id, "allocated", 2, "b", "queued"),
    ]
    await nothing_more(notes)
