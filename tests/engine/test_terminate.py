"""Terminate (docs/preemption.md, "Terminate"): an admin ends a request as a preemption would,
through ``preempting`` with the pool's grace period; a non-preemptible allocation only with
force; a second forced call ends a ``preempting`` request at once; a terminated request is
never requeued, whatever its ``max_retries``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import asyncpg
import engine_support as es
import pytest
from respool_client.wire import Request

from app.db import batch as db_batch
from app.db import requests as db_requests
from app.db.errors import BadInput, Conflict, NotFound


@pytest.fixture(autouse=True)
async def healthy_after(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """Every test leaves the engine's invariants whole."""
    yield
    await es.assert_healthy(conn)


def gpu(n: int = 1, **kw: Any) -> dict[str, Any]:
    return {"subject": "S", "pool": "p", "resources": {"gpu": n}, **kw}


async def mk(conn: asyncpg.Connection, n: int = 1, **kw: Any) -> Request:
    return await es.mk_req(conn, "S", "p", resources={"gpu": n}, **kw)


async def terminate(
    conn: asyncpg.Connection, rid: UUID, *, force: bool = False, reason: str = ""
) -> Request:
    return await db_requests.terminate_request(conn, rid, force=force, reason=reason)


async def same_commit(conn: asyncpg.Connection, *ids: UUID) -> bool:
    """Whether one transaction wrote these requests' rows last."""
    n = await conn.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM respool.requests WHERE id = ANY ($1::uuid[])",
        list(ids),
    )
    return bool(n == 1)


async def pool_s(conn: asyncpg.Connection, grace: int = 0) -> None:
    """Pool ``p`` of 4 GPUs for ``S``, with a grace period of ``grace`` seconds."""
    await es.mk_pool_s(conn, {"gpu": 4}, preemption_grace_seconds=grace)


async def held_and_waiting(
    conn: asyncpg.Connection, *, grace: int, retries: int, waiting: int
) -> tuple[Request, Request]:
    """Pool ``p`` (:func:`pool_s`) held whole by a request with ``retries``, and a request of
    ``waiting`` GPUs queued behind it."""
    await pool_s(conn, grace)
    return await mk(conn, 4, max_retries=retries), await mk(conn, waiting)


async def reclaim_pool(conn: asyncpg.Connection, grace: int, borrower: str = "dev") -> None:
    """Pool ``p`` of 4 GPUs, all reserved for ``prod``; ``borrower`` may borrow them."""
    await es.mk_pool(conn, "p", {"gpu": 4}, preemption_grace_seconds=grace)
    await es.mk_policy(conn, "prod", "p", reserved={"gpu": 4})
    await es.mk_policy(conn, borrower, "p")


async def mk_pool_reserved(conn: asyncpg.Connection, **kw: Any) -> None:
    """Pool ``p`` of 4 GPUs, all reserved for ``S``: room for non-preemptible work."""
    await es.mk_pool(conn, "p", {"gpu": 4}, **kw)
    await es.mk_policy(conn, "S", "p", reserved={"gpu": 4})


# --- with a grace period ---------------------------------------------------------------------


async def test_grace_goes_through_preempting_and_the_holder_hears_it(
    conn: asyncpg.Connection, db_url: str
) -> None:
    await pool_s(conn, 30)
    r = await mk(conn, 2)
    listener = await asyncpg.connect(db_url)
    heard: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await listener.add_listener("respool_request", lambda *a: heard.put_nowait(json.loads(a[3])))
    try:
        done = await terminate(conn, r.id, reason="node maintenance")
        note = await asyncio.wait_for(heard.get(), timeout=1)
    finally:
        await listener.close()
    assert (done.status, done.reason) == ("preempting", "terminated")
    assert done.message == "terminated by an admin: node maintenance; release within 30 s"
    assert (note["id"], note["status"], note["reason"]) == (str(r.id), "preempting", "terminated")
    assert await es.allocated(conn, "p") == {"gpu": 2, "step_run": 1}  # kept until it leaves
    assert (await es.events(conn, r.id))[-1] == ("allocated", "preempting", "terminated")


async def test_release_in_grace_ends_it_terminated_and_never_requeued(
    conn: asyncpg.Connection,
) -> None:
    await pool_s(conn, 30)
    r = await mk(conn, 2, max_retries=3)
    await terminate(conn, r.id, reason="bad job")
    done = await db_requests.release_request(conn, r.id)
    assert (done.status, done.reason, done.attempt) == ("preempted", "terminated", 1)
    assert done.message.startswith("terminated by an admin: bad job")
    assert await es.allocated(conn, "p") == {}
    assert await es.queue(conn) == []


async def test_grace_deadline_ends_it_terminated_and_never_requeued(
    conn: asyncpg.Connection,
) -> None:
    r, waiting = await held_and_waiting(conn, grace=30, retries=3, waiting=1)
    assert waiting.status == "queued"
    await terminate(conn, r.id, reason="bad job")
    now = await es.db_now(conn)
    assert (await es.reconcile(conn, "p", now + timedelta(seconds=10)))["grace_ended"] == 0
    assert await es.status(conn, r.id) == "preempting"
    done = await es.reconcile(conn, "p", now + timedelta(seconds=31))
    assert (done["grace_ended"], done["allocated"]) == (1, 1)
    after = await es.get(conn, r.id)
    assert (after.status, after.reason, after.attempt) == ("preempted", "terminated", 1)
    assert after.message == (
        "terminated by an admin: bad job; the grace period ended before the client released"
    )
    assert await es.status(conn, waiting.id) == "allocated"
    assert await es.queue_ids(conn, "p") == []


async def test_a_preemption_with_retries_left_still_requeues(conn: asyncpg.Connection) -> None:
    # The no-requeue rule is terminate's own: an ordinary grace expiry requeues as before.
    await reclaim_pool(conn, 30)
    d = await es.mk_req(conn, "dev", "p", resources={"gpu": 4}, max_retries=1)
    p = await es.mk_req(conn, "prod", "p", resources={"gpu": 4})
    now = await es.db_now(conn)
    await es.reconcile(conn, "p", now)
    assert await es.status(conn, d.id) == "preempting"
    await es.reconcile(conn, "p", now + timedelta(seconds=31))
    after = await es.get(conn, d.id)
    assert (after.status, after.attempt) == ("queued", 2)
    assert await es.status(conn, p.id) == "allocated"


# --- without a grace period ------------------------------------------------------------------


async def test_no_grace_preempted_at_once_and_the_queue_granted_in_the_same_transaction(
    conn: asyncpg.Connection,
) -> None:
    await pool_s(conn)
    r = await mk(conn, 4, max_retries=2)
    waiting = await mk(conn, 3)
    assert waiting.status == "queued"
    done = await terminate(conn, r.id, reason="runaway")
    assert (done.status, done.reason, done.attempt) == ("preempted", "terminated", 1)
    assert done.message == "terminated by an admin: runaway"
    assert await es.status(conn, waiting.id) == "allocated"
    assert await same_commit(conn, r.id, waiting.id)
    assert await es.allocated(conn, "p") == {"gpu": 3, "step_run": 1}
    assert (await es.events(conn, r.id))[-1] == ("allocated", "preempted", "terminated")


async def test_an_empty_reason_leaves_a_plain_message(conn: asyncpg.Connection) -> None:
    await pool_s(conn)
    r = await mk(conn, 1)
    done = await terminate(conn, r.id)
    assert (done.status, done.message) == ("preempted", "terminated by an admin")


# --- non-preemptible, force, second call -----------------------------------------------------


@pytest.mark.parametrize("grace", [0, 30])
async def test_non_preemptible_refused_without_force(conn: asyncpg.Connection, grace: int) -> None:
    await mk_pool_reserved(conn, preemption_grace_seconds=grace)
    r = await mk(conn, 2, preemptible=False)
    assert r.status == "allocated"
    with pytest.raises(Conflict) as err:
        await terminate(conn, r.id, reason="x")
    assert err.value.field == "force"
    assert "not preemptible" in str(err.value)
    after = await es.get(conn, r.id)
    assert (after.status, after.version) == ("allocated", r.version)
    assert await es.allocated(conn, "p") == {"gpu": 2, "step_run": 1}


async def test_non_preemptible_with_force_goes_through_preempting(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool_reserved(conn, preemption_grace_seconds=30)
    r = await mk(conn, 2, preemptible=False, max_retries=1)
    assert r.status == "allocated"
    done = await terminate(conn, r.id, force=True, reason="x")
    assert (done.status, done.reason) == ("preempting", "terminated")
    released = await db_requests.release_request(conn, r.id)
    assert (released.status, released.reason) == ("preempted", "terminated")
    usage = await es.policy_usage(conn, "p", "S")
    assert (usage["gpu"]["used"], usage["gpu"]["np_used"]) == (0, 0)


async def test_non_preemptible_with_force_and_no_grace_is_preempted(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool_reserved(conn)
    r = await mk(conn, 2, preemptible=False)
    assert r.status == "allocated"
    done = await terminate(conn, r.id, force=True)
    assert (done.status, done.reason) == ("preempted", "terminated")
    assert await es.allocated(conn, "p") == {}


async def test_second_forced_call_ends_a_preempting_request_at_once(
    conn: asyncpg.Connection,
) -> None:
    r, waiting = await held_and_waiting(conn, grace=300, retries=2, waiting=4)
    await terminate(conn, r.id, reason="first")
    again = await terminate(conn, r.id, reason="second")  # without force: already leaving
    assert (again.status, again.message) == ("preempting", (await es.get(conn, r.id)).message)
    assert again.version == (await es.get(conn, r.id)).version
    assert await es.status(conn, waiting.id) == "queued"
    done = await terminate(conn, r.id, force=True, reason="now")
    assert (done.status, done.reason, done.attempt) == ("preempted", "terminated", 1)
    assert done.message == "terminated by an admin: now"
    assert await es.status(conn, waiting.id) == "allocated"
    assert await same_commit(conn, r.id, waiting.id)


async def test_forced_call_ends_an_ordinary_preemption_without_requeue(
    conn: asyncpg.Connection,
) -> None:
    await reclaim_pool(conn, 300)
    d = await es.mk_req(conn, "dev", "p", resources={"gpu": 4}, max_retries=3)
    p = await es.mk_req(conn, "prod", "p", resources={"gpu": 4})
    await es.reconcile(conn, "p")
    assert await es.status(conn, d.id) == "preempting"
    done = await terminate(conn, d.id, force=True)
    assert (done.status, done.reason, done.attempt) == ("preempted", "terminated", 1)
    assert await es.status(conn, p.id) == "allocated"  # its earmark is served at once


# --- gangs -----------------------------------------------------------------------------------


async def gang(conn: asyncpg.Connection, *members: dict[str, Any]) -> list[Request]:
    made = await db_batch.create_requests(conn, list(members), all_or_nothing=True)
    return [m.request for m in made]


async def test_a_gang_member_takes_the_whole_gang_with_grace(conn: asyncpg.Connection) -> None:
    await pool_s(conn, 30)
    a, b, c = await gang(conn, gpu(1, max_retries=2), gpu(1, max_retries=2), gpu(1, max_retries=2))
    assert {m.status for m in (a, b, c)} == {"allocated"}
    await terminate(conn, b.id, reason="gone")
    members = [await es.get(conn, m.id) for m in (a, b, c)]
    assert [(m.status, m.reason) for m in members] == [("preempting", "terminated")] * 3
    assert f"member {b.id} was terminated by an admin: gone" in members[0].message
    done = await terminate(conn, a.id, force=True)
    assert done.status == "preempted"
    members = [await es.get(conn, m.id) for m in (a, b, c)]
    assert [(m.status, m.reason, m.attempt) for m in members] == [
        ("preempted", "terminated", 1)
    ] * 3
    assert await es.allocated(conn, "p") == {}
    assert await es.queue(conn) == []


async def test_a_gang_member_takes_the_whole_gang_without_grace(
    conn: asyncpg.Connection,
) -> None:
    await pool_s(conn)
    members = await gang(conn, gpu(2, max_retries=1), gpu(2, max_retries=1))
    waiting = await mk(conn, 4)
    await terminate(conn, members[0].id)
    after = [await es.get(conn, m.id) for m in members]
    assert [(m.status, m.reason) for m in after] == [("preempted", "terminated")] * 2
    assert await es.status(conn, waiting.id) == "allocated"


async def test_forced_call_on_a_gang_half_requeued_after_a_preemption(
    conn: asyncpg.Connection,
) -> None:
    # A gang preempted by reclaim: one member released in its grace period and waits, queued
    # again for its gang; the other is still preempting. A forced terminate ends them both.
    await reclaim_pool(conn, 300, "S")
    a, b = await gang(conn, gpu(2, max_retries=1), gpu(2, max_retries=1))
    p = await es.mk_req(conn, "prod", "p", resources={"gpu": 4})
    await es.reconcile(conn, "p")
    assert await es.statuses(conn, a.id, b.id) == ["preempting", "preempting"]
    await db_requests.release_request(conn, a.id)
    waiting = await es.get(conn, a.id)
    assert (waiting.status, waiting.attempt) == ("queued", 2)
    done = await terminate(conn, b.id, force=True, reason="stop")
    assert (done.status, done.reason) == ("preempted", "terminated")
    after = await es.get(conn, a.id)
    assert (after.status, after.reason) == ("cancelled", "terminated")
    assert f"member {b.id} was terminated by an admin: stop" in after.message
    assert await es.status(conn, p.id) == "allocated"
    assert await es.queue(conn) == []


async def test_a_queued_gang_is_cancelled(conn: asyncpg.Connection) -> None:
    await pool_s(conn)
    await mk(conn, 4)
    members = await gang(conn, gpu(1), gpu(1))
    assert {m.status for m in members} == {"queued"}
    await terminate(conn, members[1].id, reason="no")
    after = [await es.get(conn, m.id) for m in members]
    assert [(m.status, m.reason) for m in after] == [("cancelled", "terminated")] * 2
    assert await es.queue(conn) == []


# --- queued, terminal, unknown, bad input ----------------------------------------------------


async def test_queued_is_cancelled(conn: asyncpg.Connection) -> None:
    await pool_s(conn)
    await mk(conn, 4)
    q = await mk(conn, 1, max_retries=5)
    done = await terminate(conn, q.id, reason="not today")
    assert (done.status, done.reason, done.message) == (
        "cancelled",
        "terminated",
        "terminated by an admin: not today",
    )
    assert await es.queue(conn) == []
    assert (await es.events(conn, q.id))[-1] == ("queued", "cancelled", "terminated")


@pytest.mark.parametrize("force", [False, True])
async def test_terminal_is_unchanged(conn: asyncpg.Connection, force: bool) -> None:
    await pool_s(conn)
    r = await mk(conn, 1)
    released = await db_requests.release_request(conn, r.id)
    done = await terminate(conn, r.id, force=force, reason="late")
    assert (done.status, done.reason, done.version) == ("released", None, released.version)
    assert done.message == released.message


async def test_unknown_id_is_not_found(conn: asyncpg.Connection) -> None:
    with pytest.raises(NotFound):
        await terminate(conn, UUID(int=7))


async def test_a_reason_over_2000_characters_is_refused(conn: asyncpg.Connection) -> None:
    await pool_s(conn)
    r = await mk(conn, 1)
    with pytest.raises(BadInput) as err:
        await terminate(conn, r.id, reason="x" * 2001)
    assert err.value.field == "reason"
    after = await es.get(conn, r.id)
    assert (after.status, after.version) == ("allocated", r.version)
    assert (await terminate(conn, r.id, reason="x" * 2000)).status == "preempted"
