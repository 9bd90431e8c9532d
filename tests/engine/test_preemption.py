"""The reconciler's preemption rules (docs/preemption.md), as a scenario table in the style of
Kueue's preemption tests, plus shrinks, retries, leases and grace periods.

Every scenario builds a pool, its policies and the allocations already running (created in
order, so the last one is the most recently allocated), adds the incoming requests, runs one
reconcile pass and asserts exactly which requests end allocated, preempted and queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

import asyncpg
import engine_support as es
import pytest

from app.db import policies as db_policies
from app.db import pools as db_pools
from app.db import reconcile as db_reconcile
from app.db import requests as db_requests
from app.db.errors import Conflict

# (subject, priority, reserved gpu, limit gpu or None)
Policy = tuple[str, int, int, int | None]
# (name, subject, gpu, preemptible)
Req = tuple[str, str, int, bool]


@dataclass
class Case:
    capacity: int
    policies: list[Policy]
    running: list[Req]
    incoming: list[Req]
    allocated: set[str]
    preempted: set[str] = field(default_factory=set)
    queued: set[str] = field(default_factory=set)
    pool: dict[str, Any] = field(default_factory=dict)  # pool settings (docs/scheduling.md)


CASES: dict[str, Case] = {
    # The seed example: prod reserves 4 of 10, dev borrows everything; prod comes back for 3.
    # Victim order is most recently allocated first; the minimal set keeps d3 (2 would not do).
    "reclaim takes the newest borrower that is enough": Case(
        10, [("prod", 10, 4, None), ("dev", 0, 0, None)],
        running=[("d1", "dev", 4, True), ("d2", "dev", 4, True), ("d3", "dev", 2, True)],
        incoming=[("p1", "prod", 3, True)],
        allocated={"d1", "d3", "p1"}, preempted={"d2"}),
    "reclaim of the newest borrowers first": Case(
        9, [("prod", 0, 6, None), ("dev", 0, 0, None)],
        running=[("d1", "dev", 3, True), ("d2", "dev", 3, True), ("d3", "dev", 3, True)],
        incoming=[("p1", "prod", 6, True)],
        allocated={"d1", "p1"}, preempted={"d2", "d3"}),
    "reclaim ignores the borrower's higher priority": Case(
        8, [("prod", 0, 4, None), ("dev", 100, 0, None)],
        running=[("d1", "dev", 4, True), ("d2", "dev", 4, True)],
        incoming=[("p1", "prod", 4, True)],
        allocated={"d1", "p1"}, preempted={"d2"}),
    "reclaim never takes from a subject within its own share": Case(
        8, [("a", 0, 4, None), ("b", 0, 4, None)],
        running=[("b1", "b", 4, True), ("a1", "a", 2, True)],
        incoming=[("a2", "a", 4, True)],  # a would borrow: 2 + 4 > 4, and b is not borrowing
        allocated={"b1", "a1"}, queued={"a2"}),
    "priority preemption takes a lower-priority borrower": Case(
        4, [("lo", 0, 0, None), ("hi", 10, 0, None)],
        running=[("l1", "lo", 2, True), ("l2", "lo", 2, True)],
        incoming=[("h1", "hi", 2, True)],
        allocated={"l1", "h1"}, preempted={"l2"}),
    "priority preemption prefers the lowest priority": Case(
        4, [("lo", 0, 0, None), ("mid", 5, 0, None), ("hi", 10, 0, None)],
        running=[("l1", "lo", 2, True), ("m1", "mid", 2, True)],
        incoming=[("h1", "hi", 2, True)],
        allocated={"m1", "h1"}, preempted={"l1"}),
    "equal priorities never preempt each other": Case(
        4, [("a", 0, 0, None), ("b", 0, 0, None)],
        running=[("a1", "a", 4, True)],
        incoming=[("b1", "b", 2, True)],
        allocated={"a1"}, queued={"b1"}),
    "a lower priority never preempts a higher one": Case(
        4, [("lo", 0, 0, None), ("hi", 10, 0, None)],
        running=[("h1", "hi", 4, True)],
        incoming=[("l1", "lo", 2, True)],
        allocated={"h1"}, queued={"l1"}),
    "non-preemptible work is never a victim": Case(
        4, [("lo", 0, 4, None), ("hi", 10, 0, None)],
        running=[("l1", "lo", 4, False)],
        incoming=[("h1", "hi", 2, True)],
        allocated={"l1"}, queued={"h1"}),
    "non-preemptible work is skipped for a preemptible one": Case(
        6, [("dev", 0, 2, None), ("prod", 0, 4, None)],
        running=[("dn", "dev", 2, False), ("dp", "dev", 2, True), ("dq", "dev", 2, True)],
        incoming=[("p1", "prod", 4, True)],
        allocated={"dn", "p1"}, preempted={"dp", "dq"}),
    "no useless preemption when the victims would not make room": Case(
        4, [("lo", 0, 0, None), ("hi", 10, 0, None), ("np", 20, 2, None)],
        running=[("l1", "lo", 2, True), ("n1", "np", 2, False)],
        incoming=[("h1", "hi", 4, True)],
        allocated={"l1", "n1"}, queued={"h1"}),
    "a borrowing request does not reclaim": Case(
        4, [("a", 0, 1, None), ("b", 0, 0, None)],
        running=[("b1", "b", 4, True)],
        incoming=[("a1", "a", 2, True)],  # 2 > reserved 1, and equal priority
        allocated={"b1"}, queued={"a1"}),
    "reserved guarantee with three subjects under contention": Case(
        12, [("a", 0, 4, None), ("b", 0, 4, None), ("c", 0, 4, None)],
        running=[("c1", "c", 4, True), ("c2", "c", 4, True), ("c3", "c", 4, True)],
        incoming=[("a1", "a", 4, False), ("b1", "b", 4, False)],
        allocated={"c1", "a1", "b1"}, preempted={"c2", "c3"}),
    "reserved guarantee for every subject at once": Case(
        9, [("a", 5, 3, None), ("b", 0, 3, None), ("c", 0, 3, None)],
        running=[("a1", "a", 3, True), ("a2", "a", 3, True), ("b1", "b", 3, True)],
        incoming=[("c1", "c", 3, False)],  # a borrows 3 at a higher priority: reclaimed anyway
        allocated={"a1", "b1", "c1"}, preempted={"a2"}),
    "non-preemptible request takes its own subject's preemptible work first": Case(
        8, [("a", 0, 4, None), ("b", 0, 4, None)],
        running=[("ap", "a", 4, True), ("bp", "b", 4, True)],
        incoming=[("an", "a", 2, False)],
        allocated={"bp", "an"}, preempted={"ap"}),
    "the limit still caps a reclaiming request": Case(
        8, [("a", 0, 4, 4), ("b", 0, 0, None)],
        running=[("a1", "a", 2, True), ("b1", "b", 6, True)],
        incoming=[("a2", "a", 3, True)],  # 2 + 3 > limit 4: waits, nobody is preempted
        allocated={"a1", "b1"}, queued={"a2"}),
    "higher-priority in-share request goes first": Case(
        4, [("x", 10, 2, None), ("y", 0, 2, None), ("z", 0, 0, None)],
        running=[("z1", "z", 2, True), ("z2", "z", 2, True)],
        incoming=[("y1", "y", 2, True), ("x1", "x", 2, True)],
        allocated={"x1", "y1"}, preempted={"z1", "z2"}),
    # Starvation guard: the pool holds for its head (big, waiting since starvation_seconds 0), yet
    # the reconciler's rules are unchanged: prod reclaims its share, taking a GPU the head needs.
    "a starvation hold does not stop reclaim": Case(
        8, [("dev", 10, 0, None), ("big", 10, 0, None), ("prod", 0, 4, None)],
        running=[("d1", "dev", 4, True), ("d2", "dev", 4, True)],
        incoming=[("b1", "big", 8, True), ("p1", "prod", 4, True)],
        allocated={"d1", "p1"}, preempted={"d2"}, queued={"b1"},
        pool={"starvation_seconds": 0}),
    "a held-for head still preempts lower-priority borrowers": Case(
        8, [("dev", 0, 0, None), ("big", 10, 0, None)],
        running=[("d1", "dev", 4, True), ("d2", "dev", 4, True)],
        incoming=[("b1", "big", 8, True)],
        allocated={"b1"}, preempted={"d1", "d2"},
        pool={"starvation_seconds": 0}),
}  # fmt: skip


async def build(conn: asyncpg.Connection, case: Case, **pool_kw: Any) -> dict[str, UUID]:
    await es.mk_pool(conn, "p", {"gpu": case.capacity}, **pool_kw)
    for subject, priority, reserved, limit in case.policies:
        await es.mk_policy(
            conn, subject, "p", priority=priority,
            reserved={"gpu": reserved} if reserved else {},
            limit={"gpu": limit} if limit else {},
        )  # fmt: skip
    ids: dict[str, UUID] = {}
    for requests, expected in ((case.running, "allocated"), (case.incoming, "queued")):
        for name, subject, gpu, preemptible in requests:
            r = await es.mk_req(conn, subject, "p", resources={"gpu": gpu}, preemptible=preemptible)
            assert r.status == expected, (name, r.message)
            ids[name] = r.id
    return ids


async def outcome(conn: asyncpg.Connection, ids: dict[str, UUID]) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {"allocated": set(), "preempted": set(), "queued": set()}
    for name, rid in ids.items():
        seen.setdefault(await es.status(conn, rid), set()).add(name)
    return seen


@pytest.mark.parametrize("name", list(CASES))
async def test_scenario(conn: asyncpg.Connection, name: str) -> None:
    case = CASES[name]
    ids = await build(conn, case, **case.pool)
    await es.reconcile(conn, "p")
    expected = {"allocated": case.allocated, "preempted": case.preempted, "queued": case.queued}
    assert await outcome(conn, ids) == expected
    await es.assert_healthy(conn)
    # A second pass changes nothing: no flapping.
    again = await es.reconcile(conn, "p")
    assert (again["preempted"], again["allocated"]) == (0, 0)
    assert await outcome(conn, ids) == expected


async def test_victim_history_and_message(conn: asyncpg.Connection) -> None:
    ids = await build(conn, CASES["reclaim of the newest borrowers first"])
    done = await es.reconcile(conn, "p")
    assert done == {"pool": "p", "expired": 0, "grace_ended": 0, "preempted": 2,
                    "allocated": 1, "rejected": 0}  # fmt: skip
    victim = await es.get(conn, ids["d3"])
    assert (victim.reason, victim.finished_at is not None) == ("reclaim", True)
    # the message does not name the request it was preempted for; its event does, as data
    assert victim.message == "preempted (reclaim) for another request"
    cause = await conn.fetchrow(
        "SELECT cause_request_id, cause_subject FROM respool.events"
        " WHERE request_id = $1 AND to_status = 'preempted'",
        ids["d3"],
    )
    assert tuple(cause) == (ids["p1"], "prod")
    assert await es.events(conn, ids["d3"]) == [
        (None, "queued", None),
        ("queued", "allocated", None),
        ("allocated", "preempted", "reclaim"),
    ]


async def _shrink_capacity(conn: asyncpg.Connection) -> None:
    await db_pools.update_pool(conn, "p", capacity={"gpu": 5})


async def _shrink_limit_of_a(conn: asyncpg.Connection) -> None:
    policy = (await db_policies.list_policies(conn, subject="a"))[0]
    await db_policies.update_policy(conn, str(policy.id), limit={"gpu": 3})


# name: (case (expected outcome included), the shrink, the invariant it breaks, the victim that
# carries the reason, that reason)
SHRINKS = {
    # 3 units too many: l2 (2, newest low) then l1 (2) -> both needed.
    "capacity shrink preempts lowest priority newest first": (
        Case(8, [("lo", 0, 0, None), ("hi", 10, 0, None)],
             running=[("l1", "lo", 2, True), ("l2", "lo", 2, True), ("h1", "hi", 2, True),
                      ("h2", "hi", 2, True)],
             incoming=[], allocated={"h1", "h2"}, preempted={"l1", "l2"}),
        _shrink_capacity, "I1", "l2", "capacity_shrink"),
    "limit shrink preempts the subject's newest": (
        Case(10, [("a", 0, 0, 6), ("b", 0, 0, None)],
             running=[("a1", "a", 2, True), ("b1", "b", 2, True), ("a2", "a", 2, True),
                      ("a3", "a", 2, True)],
             incoming=[], allocated={"a1", "b1"}, preempted={"a2", "a3"}),
        _shrink_limit_of_a, "I2", "a3", "limit_shrink"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SHRINKS))
async def test_shrink_preempts(conn: asyncpg.Connection, name: str) -> None:
    case, shrink, invariant, victim, reason = SHRINKS[name]
    ids = await build(conn, case)
    await shrink(conn)
    assert [v.invariant for v in await db_reconcile.invariant_violations(conn)] == [invariant]
    await es.reconcile(conn, "p")
    assert await outcome(conn, ids) == {
        "allocated": case.allocated,
        "preempted": case.preempted,
        "queued": set(),
    }
    assert (await es.get(conn, ids[victim])).reason == reason
    await es.assert_healthy(conn)


async def test_retry_requeues_with_original_queue_time(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "prod", "p", reserved={"gpu": 4})
    await es.mk_policy(conn, "dev", "p")
    d = await es.mk_req(conn, "dev", "p", resources={"gpu": 4}, max_retries=1)
    queued_at = await conn.fetchval("SELECT queued_at FROM respool.requests WHERE id = $1", d.id)
    p = await es.mk_req(conn, "prod", "p", resources={"gpu": 2})
    await es.reconcile(conn, "p")
    again = await es.get(conn, d.id)
    assert (again.status, again.attempt, again.reason) == ("queued", 2, "retry")
    assert (
        await conn.fetchval("SELECT queued_at FROM respool.requests WHERE id = $1", d.id)
        == queued_at
    )
    assert await es.events(conn, d.id) == [
        (None, "queued", None), ("queued", "allocated", None),
        ("allocated", "preempted", "reclaim"), ("preempted", "queued", "retry"),
    ]  # fmt: skip
    # The stale attempt is fenced off; the new one runs once prod is done.
    with pytest.raises(Conflict):
        await db_requests.release_request(conn, d.id, attempt=1)
    await db_requests.release_request(conn, p.id)
    assert (await es.get(conn, d.id)).status == "allocated"
    # Preempted again on its last attempt: terminal.
    await es.mk_req(conn, "prod", "p", resources={"gpu": 2})
    await es.reconcile(conn, "p")
    final = await es.get(conn, d.id)
    assert (final.status, final.attempt, final.finished_at is not None) == ("preempted", 2, True)
    await es.assert_healthy(conn)


async def test_lease_expiry_with_and_without_heartbeat(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 2})
    await es.mk_policy(conn, "S", "p")
    silent = await es.mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=10)
    beating = await es.mk_req(conn, "S", "p", resources={"gpu": 1}, lease_seconds=10)
    waiting = await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    now = await es.db_now(conn)
    await conn.fetchval(
        "SELECT respool.heartbeat_request($1, NULL, $2)", beating.id, now + timedelta(seconds=8)
    )
    done = await es.reconcile(conn, "p", now + timedelta(seconds=12))
    assert (done["expired"], done["allocated"]) == (1, 1)
    assert (await es.get(conn, silent.id)).reason == "lease_expired"
    assert [await es.status(conn, i) for i in (silent.id, beating.id, waiting.id)] == [
        "expired",
        "allocated",
        "allocated",
    ]
    await es.assert_healthy(conn)


@pytest.fixture(params=["best_effort", "strict"])
async def grace(conn: asyncpg.Connection, request: pytest.FixtureRequest) -> dict[str, UUID]:
    """A 4-GPU pool with a 30 s grace period: prod reclaims 2 units that dev borrows, and a
    higher-priority request of ops (ahead of prod in the queue) arrives meanwhile."""
    case = Case(4, [("prod", 0, 2, None), ("dev", 0, 2, None), ("ops", 10, 0, None)],
                running=[("d1", "dev", 2, False), ("d2", "dev", 2, True)],
                incoming=[("p1", "prod", 2, True)], allocated=set())  # fmt: skip
    ids = await build(conn, case, preemption_grace_seconds=30, queueing=request.param)
    done = await es.reconcile(conn, "p")
    assert (done["preempted"], done["allocated"]) == (1, 0)
    victim = await es.get(conn, ids["d2"])
    assert (victim.status, victim.reason) == ("preempting", "reclaim")
    ids["o1"] = (await es.mk_req(conn, "ops", "p", resources={"gpu": 2})).id
    # ops may not preempt: d1 is not preemptible and d2 is already leaving.
    assert (await es.reconcile(conn, "p"))["preempted"] == 0
    return ids


async def test_grace_victim_learns_it_from_its_heartbeat(
    conn: asyncpg.Connection, grace: dict[str, UUID]
) -> None:
    answer = await db_requests.heartbeat_request(conn, grace["d2"])
    assert answer.status == "preempting" and "release within 30 s" in answer.message
    assert await es.status(conn, grace["p1"]) == "queued"
    assert "being released for it" in (await es.get(conn, grace["p1"])).message


async def test_grace_victim_releases_early_and_the_earmark_is_not_stolen(
    conn: asyncpg.Connection, grace: dict[str, UUID]
) -> None:
    await db_requests.release_request(conn, grace["d2"])
    assert await outcome(conn, grace) == {"allocated": {"d1", "p1"}, "preempted": {"d2"},
                                          "queued": {"o1"}}  # fmt: skip
    await es.assert_healthy(conn)


async def test_grace_deadline_passes(conn: asyncpg.Connection, grace: dict[str, UUID]) -> None:
    now = await es.db_now(conn)
    assert (await es.reconcile(conn, "p", now + timedelta(seconds=10)))["grace_ended"] == 0
    assert await es.status(conn, grace["d2"]) == "preempting"
    done = await es.reconcile(conn, "p", now + timedelta(seconds=31))
    assert (done["grace_ended"], done["allocated"]) == (1, 1)
    assert (await es.get(conn, grace["d2"])).reason == "grace_expired"
    assert await outcome(conn, grace) == {"allocated": {"d1", "p1"}, "preempted": {"d2"},
                                          "queued": {"o1"}}  # fmt: skip
    await es.assert_healthy(conn)
