"""Pools and subject policies, their validations and their effect on requests."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg
import pytest
from engine_support import (
    allocated,
    assert_healthy,
    get,
    mk_policy,
    mk_pool,
    mk_pool_s,
    mk_pools_s,
    mk_req,
    policy_usage,
    pool_usage,
    queue,
    status,
)

from app.db import policies as db_policies
from app.db import pools as db_pools
from app.db import requests as db_requests
from app.db.errors import BadInput, Conflict, NotFound

# --- pools -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "0pool", "gpu.pool-1_x", "a" * 63])
async def test_good_pool_names(conn: asyncpg.Connection, name: str) -> None:
    pool = await mk_pool(conn, name, {"gpu": 1})
    assert (pool.name, pool.capacity, pool.queueing, pool.preemption_grace_seconds) == (
        name,
        {"gpu": 1},
        "best_effort",
        0,
    )
    assert (await db_pools.get_pool(conn, name)).id == pool.id


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "Big"}, "name"),
        ({"name": "-x"}, "name"),
        ({"name": ".x"}, "name"),
        ({"name": "a b"}, "name"),
        ({"name": "a" * 64}, "name"),
        ({"name": "ok", "capacity": {"gpu": -1}}, "capacity.gpu"),
        ({"name": "ok", "capacity": {"gpu": 1.5}}, "capacity.gpu"),
        ({"name": "ok", "capacity": {"GPU": 1}}, "capacity.GPU"),
        ({"name": "ok", "capacity": {"gpu": 2**63}}, "capacity.gpu"),
        ({"name": "ok", "queueing": "fifo"}, "queueing"),
        ({"name": "ok", "preemption_grace_seconds": -1}, "preemption_grace_seconds"),
        ({"name": "ok", "description": "x" * 2001}, "description"),
    ],
)
async def test_bad_pool_fields(
    conn: asyncpg.Connection, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(BadInput) as err:
        await db_pools.create_pool(conn, **kwargs)
    assert err.value.field == field
    assert await db_pools.list_pools(conn) == []


async def test_zero_capacity_is_dropped_at_creation(conn: asyncpg.Connection) -> None:
    pool = await mk_pool(conn, "p", {"gpu": 0, "tpu": 2})
    assert pool.capacity == {"tpu": 2}


async def test_duplicate_pool_name(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 1})
    with pytest.raises(Conflict) as err:
        await mk_pool(conn, "p", {"gpu": 2})
    assert err.value.field == "name" and "p" in err.value.message
    assert (await db_pools.get_pool(conn, "p")).capacity == {"gpu": 1}


AB1 = UUID("abcd1111-0000-4000-8000-000000000001")
AB2 = UUID("abcd2222-0000-4000-8000-000000000002")


@pytest.fixture
async def refs(conn: asyncpg.Connection) -> asyncpg.Connection:
    """One pool named abcd, then two whose ids share the prefix abcd (ids fixed for the test).

    The name comes first: once an id starts with abcd, create_pool refuses that name.
    """
    await mk_pool(conn, "abcd", {"gpu": 1})
    await conn.execute(
        "INSERT INTO respool.pools (id, name) VALUES ($1, 'first'), ($2, 'second')", AB1, AB2
    )
    return conn


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("first", AB1),
        (str(AB1), AB1),
        (str(AB2).upper(), AB2),
        ("abcd1", AB1),  # unique prefix
        ("ABCD2", AB2),
        ("abcd1111-0000", AB1),
    ],
)
async def test_pool_refs(refs: asyncpg.Connection, ref: str, expected: UUID | str) -> None:
    pool = await db_pools.get_pool(refs, ref)
    assert pool.id == expected or pool.name == expected


async def test_a_name_that_is_another_pools_id_prefix_is_ambiguous(
    refs: asyncpg.Connection,
) -> None:
    # A ref is never resolved silently; the error lists both.
    with pytest.raises(BadInput) as err:
        await db_pools.get_pool(refs, "abcd")
    assert err.value.field == "pool"
    assert "abcd" in err.value.message and str(AB1) in err.value.message


async def test_ambiguous_prefix_lists_the_candidates(refs: asyncpg.Connection) -> None:
    named = await refs.fetchval("SELECT id FROM respool.pools WHERE name = 'abcd'")
    await db_pools.delete_pool(refs, str(named))  # now "abcd" is only a prefix
    with pytest.raises(BadInput) as err:
        await db_pools.get_pool(refs, "abcd")
    assert err.value.field == "pool"
    assert "ambiguous" in err.value.message
    assert f"first ({AB1})" in err.value.message and f"second ({AB2})" in err.value.message


@pytest.mark.parametrize("ref", ["nope", "abc", "abce", "ffff0000", str(UUID(int=5)), "ab-c"])
async def test_unknown_pool_ref(refs: asyncpg.Connection, ref: str) -> None:
    for call in (db_pools.get_pool, db_pools.delete_pool, db_pools.update_pool):
        with pytest.raises(NotFound) as err:
            await call(refs, ref)
        assert err.value.status_code == 404 and ref in err.value.message


async def test_refs_work_for_every_pool_call(refs: asyncpg.Connection) -> None:
    await mk_policy(refs, "S", "abcd2")
    assert (await db_pools.update_pool(refs, "abcd2", capacity={"gpu": 3})).id == AB2
    r = await mk_req(refs, "S", "abcd2", resources={"gpu": 3})
    assert (r.status, r.pool) == ("allocated", "second")
    assert [p.pool for p in await db_policies.list_policies(refs, pool="abcd2")] == ["second"]
    assert [x.id for x in await db_requests.list_requests(refs, pool=str(AB2))] == [r.id]


async def test_capacity_merge(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 8, "tpu": 2, "mcpu": 4000})
    pool = await db_pools.update_pool(conn, "p", capacity={"gpu": 4, "memory_mb": 1000})
    assert pool.capacity == {"gpu": 4, "tpu": 2, "mcpu": 4000, "memory_mb": 1000}
    pool = await db_pools.update_pool(conn, "p", capacity={"tpu": 0, "mcpu": 0})
    assert pool.capacity == {"gpu": 4, "memory_mb": 1000}
    pool = await db_pools.update_pool(
        conn, "p", description="d", queueing="strict", preemption_grace_seconds=30
    )
    assert (pool.capacity, pool.description, pool.queueing, pool.preemption_grace_seconds) == (
        {"gpu": 4, "memory_mb": 1000},
        "d",
        "strict",
        30,
    )
    # removing a soft key makes it untracked; removing another key makes it capacity 0
    usage = await pool_usage(conn, "p")
    assert set(usage) == {"gpu", "memory_mb"}
    await mk_policy(conn, "S", "p")
    r = await mk_req(conn, "S", "p", resources={"tpu": 1, "mcpu": 10**6})
    assert (r.status, r.reason) == ("rejected", "pool_missing_key")


async def test_shrinking_an_untracked_soft_key_in_use(conn: asyncpg.Connection) -> None:
    """A soft key that becomes untracked keeps its usage counter (so I4 still holds)."""
    await mk_pool_s(conn, {"gpu": 4, "mcpu": 4000})
    r = await mk_req(conn, "S", "p", resources={"mcpu": 1000})
    pool = await db_pools.update_pool(conn, "p", capacity={"mcpu": 0})
    assert pool.capacity == {"gpu": 4}
    assert (await pool_usage(conn, "p"))["mcpu"]["capacity"] is None
    await db_requests.release_request(conn, r.id)
    await assert_healthy(conn)


@pytest.mark.parametrize("change", [{"gpu": 4}, {"gpu": 0}, {"tpu": 0}])
async def test_capacity_below_reserved_is_refused(
    conn: asyncpg.Connection, change: dict[str, int]
) -> None:
    await mk_pool(conn, "p", {"gpu": 8, "tpu": 4})
    await mk_policy(conn, "team-a", "p", reserved={"gpu": 3, "tpu": 2})
    await mk_policy(conn, "team-b", "p", reserved={"gpu": 2, "tpu": 1})
    before = await db_pools.get_pool(conn, "p")
    with pytest.raises(Conflict) as err:
        await db_pools.update_pool(conn, "p", capacity={**change, "mcpu": 5}, description="changed")
    key = next(iter(change))
    a, b = (3, 2) if key == "gpu" else (2, 1)
    for part in (
        key,
        f"team-a reserves {a}",
        f"team-b reserves {b}",
        str(a + b),
        f"would be {change[key]}",
    ):
        assert part in err.value.message
    after = await db_pools.get_pool(conn, "p")
    assert after == before  # nothing changed, not even the other fields


async def test_shrink_rejects_queued_requests_that_can_never_fit(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 8, "tpu": 2})
    holder = await mk_req(conn, "S", "p", resources={"gpu": 2})
    never = await mk_req(conn, "S", "p", resources={"gpu": 7})
    needs_tpu = await mk_req(conn, "S", "p", resources={"gpu": 7, "tpu": 1})
    still = await mk_req(conn, "S", "p", resources={"gpu": 3})
    assert still.status == "allocated"
    fits_later = await mk_req(conn, "S", "p", resources={"gpu": 4})
    assert [never.status, needs_tpu.status, fits_later.status] == ["queued"] * 3
    await db_pools.update_pool(conn, "p", capacity={"gpu": 6, "tpu": 0})
    a, b = await get(conn, never.id), await get(conn, needs_tpu.id)
    assert (a.status, a.reason) == ("rejected", "exceeds_capacity")
    assert "gpu" in a.message and "6" in a.message
    assert (b.status, b.reason) == ("rejected", "pool_missing_key")
    assert await status(conn, fits_later.id) == "queued"
    assert [r["request_id"] for r in await queue(conn)] == [fits_later.id]
    await db_requests.release_request(conn, holder.id)
    assert await status(conn, fits_later.id) == "queued"  # 3 + 4 > 6
    await db_requests.release_request(conn, still.id)
    assert await status(conn, fits_later.id) == "allocated"
    await assert_healthy(conn)


async def test_shrink_drops_one_candidate_but_keeps_the_others(conn: asyncpg.Connection) -> None:
    await mk_pools_s(conn, {"gpu": 4}, "a", "b")
    await mk_req(conn, "S", "a", resources={"gpu": 4})
    await mk_req(conn, "S", "b", resources={"gpu": 4})
    waiting = await mk_req(conn, "S", resources={"gpu": 3})
    assert len(await queue(conn)) == 2
    await db_pools.update_pool(conn, "a", capacity={"gpu": 2})
    assert await status(conn, waiting.id) == "queued"
    assert [r["pool"] for r in await queue(conn)] == ["b"]


async def test_delete_pool(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 2})
    await mk_pool(conn, "keep", {"gpu": 2})
    pol = await mk_policy(conn, "S", "p")
    await mk_policy(conn, "S", "keep")
    done = await mk_req(conn, "S", "p", resources={"gpu": 1})
    await db_requests.release_request(conn, done.id)
    held = await mk_req(conn, "S", "p", resources={"gpu": 2})
    waiting = await mk_req(conn, "S", "p", resources={"gpu": 2})
    elsewhere = await mk_req(conn, "S", "keep", resources={"gpu": 2})

    with pytest.raises(Conflict) as err:
        await db_pools.delete_pool(conn, "p")
    assert "1 allocated and 1 queued" in err.value.message and err.value.field == "force"
    assert await status(conn, held.id) == "allocated"

    await db_pools.delete_pool(conn, "p", force=True)
    for r in (held, waiting):
        got = await get(conn, r.id)
        assert (got.status, got.reason, got.pool) == ("cancelled", "pool_deleted", "p")
    old = await get(conn, done.id)
    assert (old.status, old.pool) == ("released", "p")  # still readable with its pool name
    assert [
        (e.from_status, e.to_status) for e in await db_requests.request_events(conn, done.id)
    ] == [
        (None, "queued"),
        ("queued", "allocated"),
        ("allocated", "released"),
    ]
    with pytest.raises(NotFound):
        await db_pools.get_pool(conn, "p")
    with pytest.raises(NotFound):
        await db_policies.get_policy(conn, str(pol.id))
    assert [p.pool for p in await db_policies.list_policies(conn, subject="S")] == ["keep"]
    assert await status(conn, elsewhere.id) == "allocated"
    assert await conn.fetchval("SELECT count(*) FROM respool.pool_usage WHERE pool = 'p'") == 0
    # a new request naming it: the pool is gone
    with pytest.raises(NotFound):
        await db_requests.create_request(conn, {"subject": "S", "pool": "p"})
    await assert_healthy(conn)


async def test_delete_pool_without_live_requests_needs_no_force(conn: asyncpg.Connection) -> None:
    await mk_pool_s(conn, {"gpu": 2})
    r = await mk_req(conn, "S", "p", resources={"gpu": 3})
    assert r.status == "rejected"
    await db_pools.delete_pool(conn, "p")
    assert (await get(conn, r.id)).status == "rejected"


async def test_force_delete_keeps_requests_queued_elsewhere(conn: asyncpg.Connection) -> None:
    await mk_pools_s(conn, {"gpu": 1}, "a", "b")
    await mk_req(conn, "S", "a", resources={"gpu": 1})
    hb = await mk_req(conn, "S", "b", resources={"gpu": 1})
    waiting = await mk_req(conn, "S", resources={"gpu": 1})
    await db_pools.delete_pool(conn, "a", force=True)
    assert await status(conn, waiting.id) == "queued"
    await db_requests.release_request(conn, hb.id)
    got = await get(conn, waiting.id)
    assert (got.status, got.pool) == ("allocated", "b")
    await assert_healthy(conn)


# --- policies ----------------------------------------------------------------------------------


@pytest.fixture
async def pool(conn: asyncpg.Connection) -> asyncpg.Connection:
    await mk_pool(conn, "p", {"gpu": 8, "tpu": 4})
    return conn


async def test_policy_fields(pool: asyncpg.Connection) -> None:
    pol = await mk_policy(
        pool,
        "orchestrator:prod-stack",
        "p",
        priority=3,
        reserved={"gpu": 2, "tpu": 0},
        limit={"gpu": 4, "step_run": 5},
        description="prod",
    )
    assert (pol.subject, pol.pool, pol.priority, pol.reserved, pol.limit, pol.description) == (
        "orchestrator:prod-stack",
        "p",
        3,
        {"gpu": 2},
        {"gpu": 4, "step_run": 5},
        "prod",
    )
    assert (await db_policies.get_policy(pool, str(pol.id)[:8])).id == pol.id
    rows = await policy_usage(pool, "p", "orchestrator:prod-stack")
    assert {k: (v["reserved"], v["limit"], v["used"]) for k, v in rows.items()} == {
        "gpu": (2, 4, 0),
        "step_run": (0, 5, 0),
    }


@pytest.mark.parametrize(
    ("kwargs", "exc", "field", "in_message"),
    [
        ({"reserved": {"fpga": 1}}, BadInput, "reserved.fpga", "does not track"),
        # mcpu is a soft key, but untracked by p: it cannot be reserved either
        ({"reserved": {"mcpu": 100}}, BadInput, "reserved.mcpu", "does not track"),
        ({"reserved": {"gpu": 3}, "limit": {"gpu": 2}}, BadInput, "reserved.gpu", "limit"),
        ({"reserved": {"gpu": 9}}, Conflict, "capacity", "gpu"),
        ({"reserved": {"gpu": -1}}, BadInput, "reserved.gpu", "gpu"),
        ({"limit": {"Gpu": 1}}, BadInput, "limit.Gpu", "Gpu"),
        ({"subject": "-bad"}, BadInput, "subject", "subject"),
        ({"subject": "x" * 129}, BadInput, "subject", "subject"),
        ({"pool": "nope"}, NotFound, "pool", "nope"),
    ],
)
async def test_bad_policies(
    pool: asyncpg.Connection,
    kwargs: dict[str, Any],
    exc: type[Exception],
    field: str,
    in_message: str,
) -> None:
    args = {"subject": "S", "pool": "p", **kwargs}
    with pytest.raises(exc) as err:
        await db_policies.create_policy(pool, **args)
    assert err.value.field == field  # type: ignore[attr-defined]
    assert in_message in err.value.message  # type: ignore[attr-defined]
    assert await db_policies.list_policies(pool) == []


async def test_limit_keys_may_be_untracked(pool: asyncpg.Connection) -> None:
    pol = await mk_policy(pool, "S", "p", limit={"fpga": 1, "mcpu": 500, "step_run": 2})
    assert pol.limit == {"fpga": 1, "mcpu": 500, "step_run": 2}


async def test_duplicate_policy(pool: asyncpg.Connection) -> None:
    await mk_policy(pool, "S", "p")
    with pytest.raises(Conflict) as err:
        await mk_policy(pool, "S", "p", priority=2)
    assert "S" in err.value.message and "p" in err.value.message
    assert [p.priority for p in await db_policies.list_policies(pool)] == [0]


async def test_reserved_sum_over_policies(pool: asyncpg.Connection) -> None:
    await mk_policy(pool, "A", "p", reserved={"gpu": 5})
    b = await mk_policy(pool, "B", "p", reserved={"gpu": 3})
    with pytest.raises(Conflict) as err:
        await mk_policy(pool, "C", "p", reserved={"gpu": 1})
    assert "A reserves 5" in err.value.message and "C reserves 1" in err.value.message
    with pytest.raises(Conflict):
        await db_policies.update_policy(pool, str(b.id), reserved={"gpu": 4})
    assert (await db_policies.get_policy(pool, str(b.id))).reserved == {"gpu": 3}


async def test_update_policy_maps_merge_and_zero_removes(pool: asyncpg.Connection) -> None:
    pol = await mk_policy(pool, "S", "p", reserved={"gpu": 2, "tpu": 1}, limit={"gpu": 4, "tpu": 2})
    ref = str(pol.id)
    pol = await db_policies.update_policy(pool, ref, reserved={"gpu": 3}, limit={"step_run": 3})
    assert (pol.reserved, pol.limit) == ({"gpu": 3, "tpu": 1}, {"gpu": 4, "tpu": 2, "step_run": 3})
    pol = await db_policies.update_policy(
        pool, ref, reserved={"tpu": 0}, limit={"gpu": 0, "step_run": 0}
    )
    assert (pol.reserved, pol.limit) == ({"gpu": 3}, {"tpu": 2})
    pol = await db_policies.update_policy(pool, ref, priority=7, description="x")
    assert (pol.priority, pol.description, pol.reserved) == (7, "x", {"gpu": 3})
    with pytest.raises(BadInput) as err:
        await db_policies.update_policy(pool, ref, limit={"gpu": 2})  # below reserved 3
    assert err.value.field == "reserved.gpu"
    with pytest.raises(BadInput):
        await db_policies.update_policy(pool, ref, reserved={"gpu": -1})


async def test_lowering_reserved_below_non_preemptible_usage(pool: asyncpg.Connection) -> None:
    pol = await mk_policy(pool, "S", "p", reserved={"gpu": 4})
    r = await mk_req(pool, "S", "p", resources={"gpu": 3}, preemptible=False)
    assert r.status == "allocated"
    with pytest.raises(Conflict) as err:
        await db_policies.update_policy(pool, str(pol.id), reserved={"gpu": 2}, priority=9)
    assert err.value.field == "reserved.gpu" and "3" in err.value.message
    after = await db_policies.get_policy(pool, str(pol.id))
    assert (after.reserved, after.priority) == ({"gpu": 4}, 0)
    assert (await db_policies.update_policy(pool, str(pol.id), reserved={"gpu": 3})).reserved == {
        "gpu": 3
    }
    await assert_healthy(pool)


async def test_lower_limit_rejects_queued_requests_above_it(pool: asyncpg.Connection) -> None:
    pol = await mk_policy(pool, "S", "p")
    await mk_req(pool, "S", "p", resources={"gpu": 8})
    big = await mk_req(pool, "S", "p", resources={"gpu": 5})
    small = await mk_req(pool, "S", "p", resources={"gpu": 2})
    await db_policies.update_policy(pool, str(pol.id), limit={"gpu": 4})
    got = await get(pool, big.id)
    assert (got.status, got.reason) == ("rejected", "exceeds_limit")
    assert await status(pool, small.id) == "queued"


async def test_policy_refs(pool: asyncpg.Connection) -> None:
    pol = await mk_policy(pool, "S", "p")
    for ref in (str(pol.id), str(pol.id)[:4], str(pol.id)[:13].upper()):
        assert (await db_policies.get_policy(pool, ref)).id == pol.id
    for ref in ("nope", str(UUID(int=1)), "abc"):
        with pytest.raises(NotFound):
            await db_policies.get_policy(pool, ref)


async def test_delete_policy(pool: asyncpg.Connection) -> None:
    pol = await mk_policy(pool, "S", "p")
    other = await mk_policy(pool, "T", "p")
    held = await mk_req(pool, "S", "p", resources={"gpu": 8})
    waiting = await mk_req(pool, "S", "p", resources={"gpu": 1})
    t_waiting = await mk_req(pool, "T", "p", resources={"gpu": 8})
    with pytest.raises(Conflict) as err:
        await db_policies.delete_policy(pool, str(pol.id))
    assert "1 allocated and 1 queued" in err.value.message
    assert await status(pool, held.id) == "allocated"
    await db_policies.delete_policy(pool, str(pol.id), force=True)
    for r in (held, waiting):
        got = await get(pool, r.id)
        assert (got.status, got.reason) == ("cancelled", "policy_deleted")
    assert await status(pool, t_waiting.id) == "allocated"  # the freed units are granted at once
    assert [p.id for p in await db_policies.list_policies(pool)] == [other.id]
    assert await allocated(pool, "p") == {"gpu": 8, "step_run": 1}
    # without a policy the subject is rejected again
    r = await mk_req(pool, "S", "p")
    assert (r.status, r.reason) == ("rejected", "no_policy")
    await assert_healthy(pool)


async def test_delete_policy_without_live_requests(pool: asyncpg.Connection) -> None:
    pol = await mk_policy(pool, "S", "p")
    r = await mk_req(pool, "S", "p", resources={"gpu": 1})
    await db_requests.release_request(pool, r.id)
    await db_policies.delete_policy(pool, str(pol.id))
    assert (await get(pool, r.id)).status == "released"
    await assert_healthy(pool)
