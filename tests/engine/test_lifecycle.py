"""Release, cancel, heartbeat (with fencing), delete, lease expiry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from uuid import uuid4

import asyncpg
import pytest
from engine_support import (
    allocated,
    assert_healthy,
    events,
    get,
    heartbeat_at,
    mk_pool_s,
    mk_req,
    pool_id,
    queue,
    status,
)
from respool_client import wire as q

from app.db import requests as db_requests
from app.db.errors import Conflict, NotFound


@pytest.fixture
async def db(conn: asyncpg.Connection) -> asyncpg.Connection:
    await mk_pool_s(conn, {"gpu": 2})
    return conn


async def expire_at(conn: asyncpg.Connection, pool: str, now: datetime) -> int:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT respool.expire_leases(p_pool_id => $1, p_now => $2)", await pool_id(conn, pool), now
    )


async def make(conn: asyncpg.Connection, state: str) -> q.Request:
    """A request of subject S in pool p in the given state (the pool is otherwise left alone)."""
    if state == "queued":
        await mk_req(conn, "S", "p", resources={"gpu": 2})
        return await mk_req(conn, "S", "p", resources={"gpu": 2})
    if state == "rejected":
        return await mk_req(conn, "S", "p", resources={"gpu": 3})
    r = await mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=30)
    if state == "released":
        await db_requests.release_request(conn, r.id)
    elif state == "cancelled":
        await db_requests.cancel_request(conn, r.id)
    elif state == "expired":
        assert r.lease_expires_at is not None
        assert await expire_at(conn, "p", r.lease_expires_at) == 1
    else:
        assert state == "allocated"
    got = await get(conn, r.id)
    assert got.status == state
    return got


Action = Callable[..., Awaitable[q.Request]]


@pytest.mark.parametrize(
    ("action", "before", "after", "reason"),
    [
        (db_requests.release_request, "allocated", "released", None),
        (db_requests.release_request, "queued", "cancelled", "released_while_queued"),
        (db_requests.cancel_request, "allocated", "cancelled", "cancelled"),
        (db_requests.cancel_request, "queued", "cancelled", "cancelled"),
    ],
    ids=["release-allocated", "release-queued", "cancel-allocated", "cancel-queued"],
)
async def test_release_and_cancel(
    db: asyncpg.Connection, action: Action, before: str, after: str, reason: str | None
) -> None:
    r = await make(db, before)
    done = await action(db, r.id)
    assert (done.status, done.reason) == (after, reason)
    assert done.finished_at is not None and done.lease_expires_at is None
    assert done.version == r.version + 1
    assert (await events(db, r.id))[-1] == (before, after, reason)
    assert r.id not in [row["request_id"] for row in await queue(db)]
    await assert_healthy(db)


async def test_release_returns_the_units(db: asyncpg.Connection) -> None:
    r = await make(db, "allocated")
    assert await allocated(db, "p") == {"gpu": 1, "step_run": 1}
    await db_requests.release_request(db, r.id)
    assert await allocated(db, "p") == {}
    usage = await db.fetch("SELECT key, used FROM respool.policy_usage WHERE subject = 'S'")
    assert all(u["used"] == 0 for u in usage)


@pytest.mark.parametrize("terminal", ["released", "cancelled", "rejected", "expired"])
@pytest.mark.parametrize(
    "action",
    [db_requests.release_request, db_requests.cancel_request, db_requests.heartbeat_request],
    ids=["release", "cancel", "heartbeat"],
)
async def test_terminal_requests_are_unchanged(
    db: asyncpg.Connection, terminal: str, action: Action
) -> None:
    r = await make(db, terminal)
    again = await action(db, r.id)
    assert again == r
    assert await get(db, r.id) == r


@pytest.mark.parametrize(
    "action",
    [db_requests.release_request, db_requests.cancel_request, db_requests.heartbeat_request],
    ids=["release", "cancel", "heartbeat"],
)
@pytest.mark.parametrize("state", ["allocated", "queued"])
async def test_fencing_with_a_stale_attempt(
    db: asyncpg.Connection, action: Action, state: str
) -> None:
    r = await make(db, state)
    before = await db.fetchrow("SELECT * FROM respool.requests WHERE id = $1", r.id)
    n_events = len(await events(db, r.id))
    with pytest.raises(Conflict) as err:
        await action(db, r.id, attempt=r.attempt + 1)
    assert err.value.field == "attempt" and err.value.status_code == 409
    assert "stale attempt" in err.value.message
    assert await db.fetchrow("SELECT * FROM respool.requests WHERE id = $1", r.id) == before
    assert len(await events(db, r.id)) == n_events
    # the current attempt is accepted
    done = await action(db, r.id, attempt=r.attempt)
    assert done.attempt == 1
    await assert_healthy(db)


@pytest.mark.parametrize(
    "action",
    [
        db_requests.release_request,
        db_requests.cancel_request,
        db_requests.heartbeat_request,
        db_requests.get_request,
        db_requests.delete_request,
        db_requests.request_events,
    ],
)
async def test_unknown_request_is_not_found(
    db: asyncpg.Connection, action: Callable[..., Awaitable[object]]
) -> None:
    with pytest.raises(NotFound):
        await action(db, uuid4())


async def test_heartbeat_extends_the_lease(db: asyncpg.Connection) -> None:
    r = await mk_req(db, "S", "p", resources={"gpu": 1}, lease_seconds=30)
    assert r.allocated_at is not None
    assert r.lease_expires_at == r.allocated_at + timedelta(seconds=30)
    later = r.allocated_at + timedelta(seconds=20)
    hb = await heartbeat_at(db, r.id, later, attempt=1)
    assert (hb.status, hb.lease_expires_at) == ("allocated", later + timedelta(seconds=30))
    assert hb.version == r.version  # a heartbeat is not a status change
    # the expiry pass honours the extended lease
    assert await expire_at(db, "p", r.lease_expires_at + timedelta(seconds=1)) == 0
    assert await status(db, r.id) == "allocated"
    # and the plain wrapper (the database clock) extends it too
    hb2 = await db_requests.heartbeat_request(db, r.id)
    assert hb2.lease_expires_at is not None and hb2.lease_expires_at > r.lease_expires_at


async def test_heartbeat_without_lease_or_while_queued(db: asyncpg.Connection) -> None:
    no_lease = await mk_req(db, "S", "p", resources={"gpu": 2})
    assert no_lease.lease_expires_at is None
    assert (await db_requests.heartbeat_request(db, no_lease.id)).lease_expires_at is None
    waiting = await mk_req(db, "S", "p", resources={"gpu": 1}, lease_seconds=30)
    hb = await db_requests.heartbeat_request(db, waiting.id)
    assert (hb.status, hb.lease_expires_at, hb.version) == ("queued", None, waiting.version)


async def test_lapsed_leases_expire_and_the_queue_moves(db: asyncpg.Connection) -> None:
    a = await mk_req(db, "S", "p", resources={"gpu": 1}, lease_seconds=30)
    b = await mk_req(db, "S", "p", resources={"gpu": 1}, lease_seconds=300)
    waiting = await mk_req(db, "S", "p", resources={"gpu": 1})
    assert a.lease_expires_at is not None
    # not yet: the lease lapses at lease_expires_at
    assert await expire_at(db, "p", a.lease_expires_at - timedelta(microseconds=1)) == 0
    assert await expire_at(db, "p", a.lease_expires_at) == 1
    got = await get(db, a.id)
    assert (got.status, got.reason, got.lease_expires_at) == ("expired", "lease_expired", None)
    assert await status(db, b.id) == "allocated"
    assert await status(db, waiting.id) == "allocated"
    assert (await events(db, a.id))[-1] == ("allocated", "expired", "lease_expired")
    await assert_healthy(db)


async def test_heartbeat_after_the_lease_lapsed_expires_it(db: asyncpg.Connection) -> None:
    r = await mk_req(db, "S", "p", resources={"gpu": 2}, lease_seconds=30)
    waiting = await mk_req(db, "S", "p", resources={"gpu": 2})
    assert r.lease_expires_at is not None
    hb = await heartbeat_at(db, r.id, r.lease_expires_at + timedelta(seconds=5))
    assert (hb.status, hb.reason) == ("expired", "lease_expired")
    assert await status(db, waiting.id) == "allocated"
    await assert_healthy(db)


async def test_stale_heartbeat_after_lapse_changes_nothing(db: asyncpg.Connection) -> None:
    r = await mk_req(db, "S", "p", resources={"gpu": 2}, lease_seconds=30)
    assert r.lease_expires_at is not None
    with pytest.raises(Conflict):
        await heartbeat_at(db, r.id, r.lease_expires_at + timedelta(seconds=5), attempt=2)
    assert await status(db, r.id) == "allocated"


@pytest.mark.parametrize("terminal", ["released", "cancelled", "rejected", "expired"])
async def test_delete_a_terminal_request_keeps_its_history(
    db: asyncpg.Connection, terminal: str
) -> None:
    """request_events is append-only (docs/ops.md); only retention removes history."""
    r = await make(db, terminal)
    assert (
        await db.fetchval("SELECT count(*) FROM respool.request_events WHERE request_id = $1", r.id)
        > 0
    )
    before = await db.fetchval(
        "SELECT count(*) FROM respool.request_events WHERE request_id = $1", r.id
    )
    await db_requests.delete_request(db, r.id)
    with pytest.raises(NotFound):
        await db_requests.get_request(db, r.id)
    assert (
        await db.fetchval("SELECT count(*) FROM respool.request_events WHERE request_id = $1", r.id)
        == before
    )
    await assert_healthy(db)


@pytest.mark.parametrize("state", ["allocated", "queued"])
async def test_delete_refuses_live_requests(db: asyncpg.Connection, state: str) -> None:
    r = await make(db, state)
    with pytest.raises(Conflict) as err:
        await db_requests.delete_request(db, r.id)
    assert state in err.value.message
    assert await get(db, r.id) == r
    await assert_healthy(db)
