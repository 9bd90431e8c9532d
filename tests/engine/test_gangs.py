"""Gangs (docs/scheduling.md): an all_or_nothing batch is granted all together in one pool or
not at all;
rejected, preempted, expired and cancelled together; one victim (or one beneficiary) of the sum."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any
from uuid import UUID

import asyncpg
import engine_support as es
import pytest
from respool_client.wire import Request

from app.db import batch as db_batch
from app.db import pools as db_pools
from app.db import requests as db_requests
from app.db.connect import APP_API, create_pool
from app.db.errors import BadInput, IdempotencyMismatch
from support.wait import wait_until


def gpu(n: int = 1, **kw: Any) -> dict[str, Any]:
    return {"subject": "S", "pool": "p", "resources": {"gpu": n}, **kw}


async def gang(conn: asyncpg.Connection, *members: dict[str, Any]) -> list[Request]:
    made = await db_batch.create_requests(conn, list(members), all_or_nothing=True)
    return [m.request for m in made]


async def ids_of(members: list[Request]) -> list[UUID]:
    return [m.id for m in members]


async def grant_commits(conn: asyncpg.Connection, gang_id: UUID) -> int:
    """How many transactions wrote the gang's rows last: 1 when one commit granted them all."""
    return int(
        await conn.fetchval(
            "SELECT count(DISTINCT xmin::text) FROM respool.requests WHERE gang_id = $1", gang_id
        )
    )


async def test_waits_until_all_fit_then_all_are_granted_in_one_transaction(
    conn: asyncpg.Connection,
) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "S", "p")
    holder = await es.mk_req(conn, "S", "p", resources={"gpu": 2})
    members = await gang(conn, gpu(1), gpu(1), gpu(1))  # two would fit, three do not
    gid = members[0].gang_id
    assert gid is not None and {m.gang_id for m in members} == {gid}
    assert [m.status for m in members] == ["queued"] * 3
    assert {m.queue_position for m in members} == {1}  # the gang waits as one
    assert all(m.message.startswith(f"gang {gid}: waiting for gpu") for m in members)
    assert await es.allocated(conn, "p") == {"gpu": 2, "step_run": 1}
    [row] = await es.queue(conn, "p")  # one queue row holding the members' sum
    assert (row["request_id"], row["resources"]) == (members[0].id, {"gpu": 3, "step_run": 3})
    await db_requests.release_request(conn, holder.id)
    after = [await es.get(conn, m.id) for m in members]
    assert [m.status for m in after] == ["allocated"] * 3
    assert len({m.allocated_at for m in after}) == 1
    assert await grant_commits(conn, gid) == 1
    assert await es.allocated(conn, "p") == {"gpu": 3, "step_run": 3}
    # released one by one as usual: the others keep their units
    await db_requests.release_request(conn, members[0].id)
    assert await es.statuses(conn, *await ids_of(members)) == ["released", "allocated", "allocated"]
    await es.assert_healthy(conn)


async def test_granted_at_create_when_the_sum_fits(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "S", "p")
    members = await gang(conn, gpu(2), gpu(1, labels={"role": "ps"}), gpu(1))
    assert [m.status for m in members] == ["allocated"] * 3
    assert await grant_commits(conn, members[0].gang_id) == 1  # type: ignore[arg-type]
    assert await es.events(conn, members[1].id) == [
        (None, "queued", None),
        ("queued", "allocated", None),
    ]
    await es.assert_healthy(conn)


async def test_queue_place_is_the_first_members(conn: asyncpg.Connection) -> None:
    """strict: the blocked gang holds everyone behind it; best_effort: a later single that fits
    passes it (as a single request of the sum would be passed)."""
    await es.mk_pool(conn, "p", {"gpu": 4}, queueing="strict")
    await es.mk_pool(conn, "q", {"gpu": 4}, starvation_seconds=None)
    for name in ("p", "q"):
        await es.mk_policy(conn, "S", name)
        await es.mk_req(conn, "S", name, resources={"gpu": 2})
        members = await gang(conn, gpu(2, pool=name), gpu(1, pool=name))
        later = await es.mk_req(conn, "S", name, resources={"gpu": 1})
        assert {m.status for m in members} == {"queued"}
        assert later.status == ("queued" if name == "p" else "allocated")
        assert (await es.get(conn, later.id)).queue_position == (2 if name == "p" else None)
    await es.assert_healthy(conn)


async def test_a_rejected_member_rejects_the_gang(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "S", "p")
    members = await gang(conn, gpu(1), gpu(9), gpu(1))
    assert [(m.status, m.reason) for m in members] == [("rejected", "exceeds_capacity")] * 3
    gid = members[0].gang_id
    assert members[0].message == (
        f"gang {gid}: member {members[1].id} was rejected: gpu: needs 9, pool p has 4"
    )
    # each member fits alone, the sum never does
    together = await gang(conn, gpu(2), gpu(2), gpu(1))
    assert [(m.status, m.reason) for m in together] == [("rejected", "exceeds_capacity")] * 3
    assert together[2].message.startswith(
        f"gang {together[0].gang_id}: its members together can never fit: gpu: needs 5"
    )
    assert await es.allocated(conn, "p") == {}
    await es.assert_healthy(conn)


async def test_a_capacity_shrink_rejects_a_queued_gang_whole(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "S", "p")
    await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    members = await gang(conn, gpu(2), gpu(2))
    assert {m.status for m in members} == {"queued"}
    await db_pools.update_pool(conn, "p", capacity={"gpu": 3})
    after = [await es.get(conn, m.id) for m in members]
    assert [(m.status, m.reason) for m in after] == [("rejected", "exceeds_capacity")] * 2
    assert all(f"gang {after[0].gang_id}" in m.message for m in after)
    await es.assert_healthy(conn)


async def test_cancel_cascades(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "S", "p")
    holding = await gang(conn, gpu(2), gpu(2))
    waiting = await gang(conn, gpu(1), gpu(1), gpu(1))
    assert {m.status for m in waiting} == {"queued"}
    # cancelling a queued member (not the one holding the queue entry) cancels the gang
    await db_requests.cancel_request(conn, waiting[2].id)
    after = [await es.get(conn, m.id) for m in waiting]
    assert [m.status for m in after] == ["cancelled"] * 3
    assert after[0].message == f"gang {after[0].gang_id}: member {waiting[2].id} was cancelled"
    # releasing a queued member cancels it, and so the gang
    again = await gang(conn, gpu(1), gpu(1), gpu(1))
    await db_requests.release_request(conn, again[0].id)
    assert await es.statuses(conn, *await ids_of(again)) == ["cancelled"] * 3
    # cancelling a holding member cancels the others and the units go back at once
    later = await es.mk_req(conn, "S", "p", resources={"gpu": 3})
    await db_requests.cancel_request(conn, holding[1].id)
    assert await es.statuses(conn, *await ids_of(holding)) == ["cancelled"] * 2
    assert (await es.get(conn, holding[0].id)).reason == "cancelled"
    assert await es.get(conn, later.id) is not None and (await es.get(conn, later.id)).status == (
        "allocated"
    )
    await es.assert_healthy(conn)


async def test_expiry_cascades(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "S", "p")
    members = await gang(conn, gpu(1, lease_seconds=10), gpu(1, lease_seconds=100), gpu(1))
    capped = await gang(conn, gpu(1, max_seconds=20))
    now = await es.db_now(conn)
    done = await es.reconcile(conn, "p", now + timedelta(seconds=12))
    assert done["expired"] == 3
    after = [await es.get(conn, m.id) for m in members]
    assert [(m.status, m.reason) for m in after] == [("expired", "lease_expired")] * 3
    assert after[1].message == f"gang {after[0].gang_id}: member {members[0].id} was expired"
    assert (await es.get(conn, capped[0].id)).status == "allocated"
    await es.reconcile(conn, "p", now + timedelta(seconds=25))
    assert (await es.get(conn, capped[0].id)).reason == "max_seconds"
    assert await es.allocated(conn, "p") == {}
    await es.assert_healthy(conn)


async def test_a_borrowing_gang_is_preempted_whole(conn: asyncpg.Connection) -> None:
    """Reclaim needs one unit; the gang is one victim of its sum, so all of it goes (and is
    requeued whole while retries are left)."""
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "S", "p")  # borrows everything
    await es.mk_policy(conn, "prod", "p", reserved={"gpu": 2})
    single = await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    members = await gang(conn, gpu(1, max_retries=1), gpu(1, max_retries=1), gpu(1, max_retries=1))
    assert {m.status for m in members} == {"allocated"}
    mine = await es.mk_req(conn, "prod", "p", resources={"gpu": 1})
    await es.reconcile(conn, "p")
    after = [await es.get(conn, m.id) for m in members]
    # the gang was allocated last: it is the victim, whole (the single is left alone)
    assert [(m.status, m.attempt) for m in after] == [("queued", 2)] * 3
    assert (await es.get(conn, single.id)).status == "allocated"
    assert (await es.get(conn, mine.id)).status == "allocated"
    history = await es.events(conn, members[1].id)
    assert history[-2:] == [("allocated", "preempted", "reclaim"), ("preempted", "queued", "retry")]
    # the victim unit's member (the lowest id) keeps the cause, the others name the gang; every
    # member's event records the request they went for as data (the message does not name it)
    sql = (
        "SELECT message, cause_request_id, cause_subject FROM respool.events"
        " WHERE request_id = $1 AND to_status = 'preempted'"
    )
    rows = sorted([tuple(await conn.fetchrow(sql, m.id)) for m in members])
    cause = "preempted (reclaim) for another request"
    assert rows[2] == (cause, mine.id, "prod")
    assert all(
        x.startswith(f"gang {members[0].gang_id}: member ")
        and x.endswith(f"was preempted; {cause}")
        and (by, of) == (mine.id, "prod")
        for x, by, of in rows[:2]
    )
    [row] = await es.queue(conn, "p")  # requeued as one entry again
    assert row["resources"] == {"gpu": 3, "step_run": 3}
    await es.assert_healthy(conn)


async def test_a_gang_owner_reclaims_enough_for_the_sum(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 6})
    await es.mk_policy(conn, "prod", "p", reserved={"gpu": 4})
    await es.mk_policy(conn, "dev", "p")
    devs = [await es.mk_req(conn, "dev", "p", resources={"gpu": 1}) for _ in range(6)]
    members = await gang(
        conn, *[{"subject": "prod", "pool": "p", "resources": {"gpu": 1}} for _ in range(3)]
    )
    assert {m.status for m in members} == {"queued"}
    await es.reconcile(conn, "p")
    assert {(await es.get(conn, m.id)).status for m in members} == {"allocated"}
    # exactly three borrowers went (minimal set for the sum), newest first
    assert await es.statuses(conn, *[d.id for d in devs]) == ["allocated"] * 3 + ["preempted"] * 3
    assert await grant_commits(conn, members[0].gang_id) == 1  # type: ignore[arg-type]
    await es.assert_healthy(conn)


async def test_a_gang_preempts_by_priority_as_one_request(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "low", "p")
    await es.mk_policy(conn, "high", "p", priority=10)
    lows = [await es.mk_req(conn, "low", "p", resources={"gpu": 1}) for _ in range(4)]
    members = await gang(conn, *[{"subject": "high", "resources": {"gpu": 1}} for _ in range(2)])
    await es.reconcile(conn, "p")
    assert {(await es.get(conn, m.id)).status for m in members} == {"allocated"}
    assert await es.statuses(conn, *[x.id for x in lows]) == ["allocated"] * 2 + ["preempted"] * 2
    await es.assert_healthy(conn)


async def reclaimed_gang(conn: asyncpg.Connection) -> tuple[list[Request], Request]:
    """A 2-GPU pool with a 30 s grace period; a gang of two 1-GPU members (one retry) borrows it
    all; the owner of the reserved 2 GPUs asks for them and a pass leaves the gang preempting.
    Returns the members and the owner's request."""
    await es.mk_pool(conn, "p", {"gpu": 2}, preemption_grace_seconds=30)
    await es.mk_policy(conn, "S", "p")
    await es.mk_policy(conn, "prod", "p", reserved={"gpu": 2})
    members = await gang(conn, gpu(1, max_retries=1), gpu(1, max_retries=1))
    mine = await es.mk_req(conn, "prod", "p", resources={"gpu": 2})
    await es.reconcile(conn, "p")
    return members, mine


async def test_grace_period_requeues_the_gang_once_every_member_left(
    conn: asyncpg.Connection,
) -> None:
    members, mine = await reclaimed_gang(conn)
    assert await es.statuses(conn, *await ids_of(members)) == ["preempting"] * 2
    await db_requests.release_request(conn, members[0].id)  # one leaves early
    first = await es.get(conn, members[0].id)
    assert (first.status, first.queue_position) == ("queued", None)
    assert (
        first.message
        == f"gang {first.gang_id}: waiting until every member has given its units back"
    )
    await es.assert_healthy(conn)
    await db_requests.release_request(conn, members[1].id)
    assert (await es.get(conn, mine.id)).status == "allocated"
    assert {(await es.get(conn, m.id)).queue_position for m in members} == {1}
    await es.assert_healthy(conn)


async def test_cancelling_a_member_in_the_grace_period_grants_the_freed_units_at_once(
    conn: asyncpg.Connection,
) -> None:
    """A cancel triggers allocation in the same transaction (docs/admission.md); cancelling one
    member cancels the member still holding, whose units go to the request they were for."""
    members, mine = await reclaimed_gang(conn)
    await db_requests.release_request(conn, members[0].id)  # requeued, waits for its gang
    assert await es.statuses(conn, *await ids_of(members)) == ["queued", "preempting"]
    await db_requests.cancel_request(conn, members[0].id)
    assert await es.statuses(conn, *await ids_of(members)) == ["cancelled", "cancelled"]
    assert (await es.get(conn, mine.id)).status == "allocated"  # no reconcile pass needed
    await es.assert_healthy(conn)


async def _waiting_or_done(
    conn: asyncpg.Connection, runner: asyncpg.Connection, run: asyncio.Task[Any]
) -> None:
    """Until ``run`` (a statement on ``runner``) finished or waits for a lock."""

    async def check() -> bool:
        waits = await conn.fetchval(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", runner.get_server_pid()
        )
        return run.done() or waits == "Lock"

    await wait_until(check, "the pass finished or waits for a lock")


async def test_reconcilers_of_two_candidate_pools_abandon_a_gang_without_deadlock(
    db_url: str,
) -> None:
    """Several reconcilers at once (docs/preemption.md): a queued gang waits in pools a and b;
    its members' queue leases lapse; the pass of b and the pass of a each find a different
    member, while a third transaction holds the third member. Both passes finish; a later pass
    abandons the whole gang."""
    connections = await create_pool(db_url, size=4, application_name=APP_API)
    conn, holder, *passes = [await connections.acquire() for _ in range(4)]
    try:
        for name in ("a", "b"):
            await es.mk_pool(conn, name, {"gpu": 3})
            await es.mk_policy(conn, "S", name)
            await es.mk_policy(conn, "X", name)
            await es.mk_req(conn, "X", name, resources={"gpu": 3}, lease_seconds=None)
        made = await gang(conn, *[{"subject": "S", "resources": {"gpu": 1}}] * 3)
        first, mid, last = sorted(m.id for m in made)
        now = await es.db_now(conn)
        for member, lease in ((mid, 10), (last, 20), (first, 3600)):  # queue leases from now
            await conn.execute(
                "SELECT respool.heartbeat_request($1, NULL, $2, $3)", member, now, lease
            )
        ids = {n: (await db_pools.get_pool(conn, n)).id for n in ("a", "b")}
        async with holder.transaction():
            await holder.execute("SELECT FROM respool.requests WHERE id = $1 FOR UPDATE", first)
            run_b = asyncio.create_task(  # mid's lease lapsed
                passes[0].fetchval(
                    "SELECT respool.reconcile_pool($1, $2)", ids["b"], now + timedelta(seconds=15)
                )
            )
            await _waiting_or_done(conn, passes[0], run_b)
            run_a = asyncio.create_task(  # mid's and last's leases lapsed
                passes[1].fetchval(
                    "SELECT respool.reconcile_pool($1, $2)", ids["a"], now + timedelta(seconds=25)
                )
            )
            await _waiting_or_done(conn, passes[1], run_a)
        await asyncio.wait_for(asyncio.gather(run_b, run_a), 30)  # a deadlock raises here
        await es.reconcile(conn, "a", now + timedelta(seconds=25))
        assert await es.statuses(conn, first, mid, last) == ["cancelled"] * 3
        assert {(await es.get(conn, m)).reason for m in (first, mid, last)} == {"abandoned"}
        await es.assert_healthy(conn)
    finally:
        for c in (conn, holder, *passes):
            await connections.release(c)
        await connections.close()


async def test_gang_id_filter(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 8})
    await es.mk_policy(conn, "S", "p")
    a = await gang(conn, gpu(), gpu(), gpu())
    await gang(conn, gpu(), gpu())
    await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    listed = await db_requests.list_requests(conn, gang_id=a[0].gang_id)
    assert sorted(r.id for r in listed) == sorted(m.id for m in a)


@pytest.mark.parametrize(
    ("other", "field"),
    [
        ({"subject": "T"}, "members[1].subject"),
        ({"pool": "q"}, "members[1].pool"),
        ({"pool": None}, "members[1].pool"),
        ({"preemptible": False}, "members[1].preemptible"),
        ({"max_retries": 2}, "members[1].max_retries"),
        ({"pool": "nope"}, "members[1].pool"),
    ],
)
async def test_members_must_agree(
    conn: asyncpg.Connection, other: dict[str, Any], field: str
) -> None:
    await es.mk_pool(conn, "p", {"gpu": 8})
    await es.mk_pool(conn, "q", {"gpu": 8})
    for s in ("S", "T"):
        for p in ("p", "q"):
            await es.mk_policy(conn, s, p)
    with pytest.raises(Exception) as caught:
        await gang(conn, gpu(), {**gpu(), **other}, gpu())
    assert getattr(caught.value, "field", None) == field
    assert await conn.fetchval("SELECT count(*) FROM respool.requests") == 0
    # the pool by id prefix is the same pool: fine
    pid = str((await db_pools.get_pool(conn, "p")).id)[:8]
    made = await gang(conn, gpu(), gpu(pool=pid))
    assert {m.status for m in made} == {"allocated"}


async def test_an_idempotent_retry_answers_the_same_gang(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 1})
    await es.mk_policy(conn, "S", "p")
    body = [gpu(idempotency_key=f"k-{i}") for i in range(2)]
    first = await gang(conn, *body)
    again = await db_batch.create_requests(conn, body, all_or_nothing=True)
    assert [m.created for m in again] == [False, False]
    assert [m.request.id for m in again] == [m.id for m in first]
    with pytest.raises(IdempotencyMismatch) as caught:  # a subset is not that gang
        await gang(conn, body[0])
    assert caught.value.field == "members[0].idempotency_key"
    with pytest.raises(IdempotencyMismatch):  # old members mixed with new ones
        await gang(conn, body[0], gpu(idempotency_key="k-new"))
    with pytest.raises(BadInput):
        await gang(conn, gpu(preemptible=False), gpu())


async def test_no_gang_is_ever_partly_allocated_under_concurrency(db_url: str) -> None:
    """Real concurrent connections create gangs and singles and release against two pools a
    gang may use: after every step no gang is partly granted and I1-I4 hold."""
    setup = await create_pool(db_url, size=1, application_name=APP_API)
    try:
        async with setup.acquire() as c:
            await es.mk_pool(c, "a", {"gpu": 6})
            await es.mk_pool(c, "b", {"gpu": 5}, queueing="strict")
            for s in ("S", "T"):
                await es.mk_policy(c, s, "a")
                await es.mk_policy(c, s, "b")
    finally:
        await setup.close()
    pool = await create_pool(db_url, size=6, application_name=APP_API)
    checks = 0

    async def check(c: asyncpg.Connection) -> None:
        nonlocal checks
        assert await es.partial_gangs(c) == []
        assert await c.fetch("SELECT * FROM respool.invariant_violations") == []
        checks += 1

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        subject = "S" if seed % 2 else "T"
        mine: list[UUID] = []
        async with pool.acquire() as c:
            for _ in range(25):
                roll = rng.random()
                if roll < 0.4:
                    n = rng.randint(2, 4)
                    body = [
                        {"subject": subject, "resources": {"gpu": rng.randint(1, 2)}}
                        for _ in range(n)
                    ]
                    made = await db_batch.create_requests(c, body, all_or_nothing=True)
                    mine += [m.request.id for m in made]
                elif roll < 0.6:
                    r = await es.mk_req(c, subject, resources={"gpu": rng.randint(1, 3)})
                    mine.append(r.id)
                elif mine:
                    victim = mine.pop(rng.randrange(len(mine)))
                    if rng.random() < 0.5:
                        await db_requests.release_request(c, victim)
                    else:
                        await db_requests.cancel_request(c, victim)
                await check(c)
            for rid in mine:  # everything ends: the queues drain
                await db_requests.release_request(c, rid)
                await check(c)

    async def reconciler() -> None:
        async with pool.acquire() as c:
            for _ in range(40):
                for name in ("a", "b"):
                    await es.reconcile(c, name)
                await check(c)
                await asyncio.sleep(0)

    try:
        await asyncio.gather(*(worker(i) for i in range(4)), reconciler())
        async with pool.acquire() as c:
            await es.assert_healthy(c)
            assert (
                await c.fetchval(
                    "SELECT count(*) FROM respool.requests WHERE status NOT IN"
                    " ('released', 'cancelled', 'rejected')"
                )
                == 0
            )
            gangs = await c.fetchval(
                "SELECT count(DISTINCT gang_id) FROM respool.requests"
                " WHERE allocated_at IS NOT NULL"
            )
            assert gangs > 0  # some gangs were granted along the way
    finally:
        await pool.close()
    assert checks > 100
