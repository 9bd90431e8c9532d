"""Priority lanes, preemption groups and team quotas in the engine (docs/preemption.md,
"Policy shapes"), each rule from the contract's words:

* lane: "its requests come before every non-lane request in queue order and may preempt any
  preemptible allocation of a non-lane policy that is borrowing, whatever the priorities; lane
  allocations never preempt each other" (also for gangs);
* group: "a request never preempts, by reclaim or by priority, an allocation of its own group
  (it waits instead, or preempts others)";
* team quota: "a request's policy on a pool is its subject's exact policy there, else the
  matching pattern with the longest literal prefix; a pattern policy's reserved and limit bound
  the sum over every subject it covers".
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from engine_support import mk_policy, mk_pool, mk_req, reconcile, statuses

from app.db import batch as db_batch
from app.db import requests as db_requests
from app.db.connect import APP_CLI, connect
from app.db.errors import BadInput, IdempotencyMismatch


async def gpu_req(conn: asyncpg.Connection, subject: str, gpu: int, **kw: Any) -> Any:
    return await mk_req(conn, subject, resources={"gpu": gpu}, **kw)


async def pool_p(conn: asyncpg.Connection, gpus: int, policies: dict[str, Any]) -> None:
    """Pool p of ``gpus`` GPUs, with a policy for each subject of ``policies`` (its options)."""
    await mk_pool(conn, "p", {"gpu": gpus})
    for subject, options in policies.items():
        await mk_policy(conn, subject, "p", **options)


async def reconciled(conn: asyncpg.Connection, *requests: Any) -> list[str]:
    """Reconciles pool p; then the status of each of ``requests``, in order."""
    await reconcile(conn, "p")
    return await statuses(conn, *(r.id for r in requests))


# --- priority lanes ----------------------------------------------------------------------------


async def test_a_lane_request_comes_before_every_non_lane_request(conn: asyncpg.Connection) -> None:
    await pool_p(
        conn, 2, {"high": {"priority": 100}, "oncall": {"priority": -5, "priority_lane": True}}
    )
    await gpu_req(conn, "high", 2)  # holds the pool
    first = await gpu_req(conn, "high", 2)
    lane = await gpu_req(conn, "oncall", 2)
    positions = dict(await conn.fetch("SELECT request_id, position FROM respool.queue"))
    assert positions[lane.id] == 1
    assert positions[first.id] == 2


# name: (the pool's GPUs, its policies, the borrower holding the pool twice, the newcomer, the
# GPUs of each request, the reason the newer holding is preempted with)
NEWCOMER_TAKES_A_BORROWER = {
    "a lane request preempts a borrower of any priority": (
        8, {"vip": {"priority": 1000}, "oncall": {"priority": 0, "priority_lane": True}},
        "vip", "oncall", 4, "priority"),
    "a reserved share is reclaimed from a borrowing lane": (
        4, {"lane": {"priority_lane": True}, "owner": {"reserved": {"gpu": 2}}},
        "lane", "owner", 2, "reclaim"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(NEWCOMER_TAKES_A_BORROWER))
async def test_the_newcomer_preempts_the_newest_borrower(
    conn: asyncpg.Connection, name: str
) -> None:
    gpus, policies, borrower, newcomer, each, reason = NEWCOMER_TAKES_A_BORROWER[name]
    await pool_p(conn, gpus, policies)
    held = [await gpu_req(conn, borrower, each), await gpu_req(conn, borrower, each)]
    new = await gpu_req(conn, newcomer, each)
    assert await reconciled(conn, new, *held) == ["allocated", "allocated", "preempted"]
    victim = await db_requests.get_request(conn, held[1].id)
    assert victim.reason == reason


# name: (pool p's policies (4 GPUs), the lane holding the pool, the subject waiting for it)
NEVER_PREEMPTS_A_LANE = {
    "lane allocations never preempt each other": ({
        "lane-low": {"priority": 0, "priority_lane": True},
        # a higher priority and a reserved share: neither lets it take another lane's work
        "lane-high": {"priority": 50, "reserved": {"gpu": 4}, "priority_lane": True},
    }, "lane-low", "lane-high"),
    "non-lane work never preempts a lane by priority": (
        {"lane": {"priority": -100, "priority_lane": True}, "vip": {"priority": 1000}},
        "lane", "vip"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(NEVER_PREEMPTS_A_LANE))
async def test_the_waiting_request_never_preempts_a_lane(
    conn: asyncpg.Connection, name: str
) -> None:
    policies, holder, waiter = NEVER_PREEMPTS_A_LANE[name]
    await pool_p(conn, 4, policies)
    held = await gpu_req(conn, holder, 4)
    waiting = await gpu_req(conn, waiter, 4)
    assert await reconciled(conn, held, waiting) == ["allocated", "queued"]


async def test_a_lane_gang_preempts_borrowers_as_one_request(conn: asyncpg.Connection) -> None:
    await pool_p(conn, 8, {"vip": {"priority": 10}, "oncall": {"priority_lane": True}})
    held = [await gpu_req(conn, "vip", 2) for _ in range(4)]
    gang = await db_batch.create_requests(
        conn,
        [{"subject": "oncall", "resources": {"gpu": 2}} for _ in range(3)],
        all_or_nothing=True,
    )
    await reconcile(conn, "p")
    members = [m.request.id for m in gang]
    assert await statuses(conn, *members) == ["allocated"] * 3
    # the minimal set: the three most recently allocated
    assert await statuses(conn, *(h.id for h in held)) == [
        "allocated",
        "preempted",
        "preempted",
        "preempted",
    ]


# --- preemption groups -------------------------------------------------------------------------


async def test_a_request_never_preempts_its_own_group_by_priority(conn: asyncpg.Connection) -> None:
    await pool_p(conn, 4, {"low": {"priority": 0}, "high": {"priority": 10}})
    held = await gpu_req(conn, "low", 4, preemption_group="run-7")
    mine = await gpu_req(conn, "high", 4, preemption_group="run-7")
    assert await reconciled(conn, held, mine) == ["allocated", "queued"]
    other = await gpu_req(conn, "high", 4, preemption_group="run-8")
    # it waits instead; a request of another group behind it preempts
    assert await reconciled(conn, held, mine, other) == ["preempted", "queued", "allocated"]


async def test_a_request_never_reclaims_from_its_own_group(conn: asyncpg.Connection) -> None:
    await pool_p(conn, 4, {"owner": {"reserved": {"gpu": 4}}, "borrower": {}})
    held = [
        await gpu_req(conn, "borrower", 2, preemption_group="sweep"),
        await gpu_req(conn, "borrower", 2),
    ]
    mine = await gpu_req(conn, "owner", 2, preemption_group="sweep")
    # the most recently allocated borrower is the only one outside the group: it goes
    assert await reconciled(conn, mine, *held) == [
        "allocated",
        "allocated",
        "preempted",
    ]
    more = await gpu_req(conn, "owner", 2, preemption_group="sweep")
    assert await reconciled(conn, more, held[0]) == ["queued", "allocated"]


async def test_what_if_names_no_victim_of_the_own_group(conn: asyncpg.Connection) -> None:
    await pool_p(conn, 4, {"low": {}, "high": {"priority": 5}})
    same = await gpu_req(conn, "low", 2, preemption_group="g")
    other = await gpu_req(conn, "low", 2)
    answer = await db_requests.what_if_request(
        conn, {"subject": "high", "resources": {"gpu": 2}, "preemption_group": "g"}
    )
    assert [v.id for v in answer.would_preempt] == [other.id]
    answer = await db_requests.what_if_request(
        conn, {"subject": "high", "resources": {"gpu": 4}, "preemption_group": "g"}
    )
    assert answer.would_preempt == [] and answer.status == "queued"
    assert await statuses(conn, same.id, other.id) == ["allocated", "allocated"]


async def test_a_gang_has_one_group(conn: asyncpg.Connection) -> None:
    await pool_p(conn, 4, {"S": {}})
    with pytest.raises(BadInput) as err:
        await db_batch.create_requests(
            conn,
            [
                {"subject": "S", "resources": {"gpu": 1}, "preemption_group": "a"},
                {"subject": "S", "resources": {"gpu": 1}, "preemption_group": "b"},
            ],
            all_or_nothing=True,
        )
    assert err.value.field == "members[1].preemption_group"


@pytest.mark.parametrize("bad", ["", "x" * 129, "a\nb", 7])
async def test_a_bad_group_is_refused_naming_the_field(conn: asyncpg.Connection, bad: Any) -> None:
    await pool_p(conn, 4, {"S": {}})
    with pytest.raises(BadInput) as err:
        await db_requests.create_request(
            conn, {"subject": "S", "resources": {"gpu": 1}, "preemption_group": bad}
        )
    assert err.value.field == "preemption_group"
    assert await conn.fetchval("SELECT count(*) FROM respool.requests") == 0


async def test_the_group_is_part_of_the_idempotent_body(conn: asyncpg.Connection) -> None:
    await pool_p(conn, 4, {"S": {}})
    body = {"subject": "S", "resources": {"gpu": 1}, "idempotency_key": "k"}
    first = await db_requests.create_request(conn, {**body, "preemption_group": "g"})
    again = await db_requests.create_request(conn, {**body, "preemption_group": "g"})
    assert (again.created, again.request.id) == (False, first.request.id)
    assert again.request.preemption_group == "g"
    with pytest.raises(IdempotencyMismatch):
        await db_requests.create_request(conn, {**body, "preemption_group": "h"})


# --- team quotas -------------------------------------------------------------------------------


async def test_exact_subject_then_longest_literal_prefix(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 16})
    team = await mk_policy(conn, "team-*", "p")
    vision = await mk_policy(conn, "team-vision:*", "p")
    exact = await mk_policy(conn, "team-vision:etl", "p")
    cases = {
        "team-vision:etl": exact.id,
        "team-vision:train": vision.id,
        "team-audio:x": team.id,
    }
    for subject, policy_id in cases.items():
        made = await gpu_req(conn, subject, 1)
        assert made.policy_id == policy_id, subject
    rejected = await gpu_req(conn, "team_vision:x", 1)  # _ is no wildcard
    assert (rejected.status, rejected.reason) == ("rejected", "no_policy")


async def test_a_pattern_limit_bounds_the_sum_over_its_subjects(conn: asyncpg.Connection) -> None:
    await pool_p(conn, 32, {"team-vision:*": {"limit": {"gpu": 16}}})
    made = [await gpu_req(conn, f"team-vision:pipeline-{i}", 4) for i in range(5)]
    assert [m.status for m in made] == ["allocated"] * 4 + ["queued"]
    usage = await conn.fetchval(
        "SELECT used FROM respool.policy_usage WHERE subject = 'team-vision:*' AND key = 'gpu'"
    )
    assert usage == 16
    await db_requests.release_request(conn, made[0].id)
    assert await statuses(conn, made[4].id) == ["allocated"]


async def test_a_pattern_reserved_share_is_one_share_for_the_team(
    conn: asyncpg.Connection,
) -> None:
    await pool_p(conn, 16, {"team-vision:*": {"reserved": {"gpu": 8}}, "research": {}})
    borrowers = [await gpu_req(conn, "research", 4) for _ in range(4)]
    a = await gpu_req(conn, "team-vision:a", 4)
    b = await gpu_req(conn, "team-vision:b", 4)
    c = await gpu_req(conn, "team-vision:c", 4)
    # a and b fill the team's share of 8 by reclaim; c would borrow: it waits
    assert await reconciled(conn, a, b, c) == ["allocated", "allocated", "queued"]
    assert sorted(await statuses(conn, *(r.id for r in borrowers))) == [
        "allocated",
        "allocated",
        "preempted",
        "preempted",
    ]


async def test_concurrent_subjects_never_pass_a_shared_limit(db_url: str) -> None:
    setup = await connect(db_url, application_name=APP_CLI)
    try:
        await mk_pool(setup, "p", {"gpu": 64})
        await mk_policy(setup, "team:*", "p", limit={"gpu": 10})
    finally:
        await setup.close()

    async def one(i: int) -> str:
        c = await connect(db_url, application_name=APP_CLI)
        try:
            made = await db_requests.create_request(
                c, {"subject": f"team:member-{i}", "resources": {"gpu": 1}}
            )
            return made.request.status
        finally:
            await c.close()

    results = await asyncio.gather(*(one(i) for i in range(24)))
    assert results.count("allocated") == 10
    check = await connect(db_url, application_name=APP_CLI)
    try:
        assert await check.fetch("SELECT * FROM respool.invariant_violations") == []
    finally:
        await check.close()
