"""Rate keys (docs/rates.md): pool keys whose units come back with time, not on release.

Written from the contract's words: a grant charges its amount of each rate key at the grant
instant; a charge counts against the window for per_seconds from its instant; used is the sum of
the charges inside the trailing window; release with used settles (refund or extra charge at the
original instant), release without used leaves the estimate charged; admission as for every key;
all keys of a request together; rate keys never a reason to preempt; the engine grants at the
instant enough charges leave the window; ETA exact for the head. Windows here are 1-2 seconds
of real time: the engine reads its own clock for charges.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from engine_support import (
    allocated,
    assert_healthy,
    events,
    get,
    mk_policy,
    mk_pool,
    mk_req,
    pool_id,
    reconcile,
    status,
)

from app.db import nodes as db_nodes
from app.db import pools as db_pools
from app.db import reconcile as db_reconcile
from app.db import requests as db_requests
from app.db.errors import BadInput, Conflict

TOKENS = {"llm_tokens": {"amount": 10_000, "per_seconds": 2}}


async def rate_used(conn: asyncpg.Connection, pool: str, key: str = "llm_tokens") -> int:
    return (await db_pools.get_pool(conn, pool)).rates[key].used


async def release(conn: asyncpg.Connection, request_id: UUID, **used: int) -> Any:
    return await db_requests.release_request(conn, request_id, used=used or None)


async def wait_until_granted(conn: asyncpg.Connection, request_id: UUID, pool: str) -> float:
    """Reconcile the pool until the request is granted; seconds waited."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while await status(conn, request_id) == "queued":
        assert loop.time() - start < 10, "never granted"
        await reconcile(conn, pool)
        await asyncio.sleep(0.02)
    return loop.time() - start


@pytest.fixture
async def llm(conn: asyncpg.Connection) -> asyncpg.Connection:
    """Pool llm: 4 GPUs and a budget of 10,000 tokens per 2 s; subjects a and b."""
    await mk_pool(conn, "llm", {"gpu": 4}, rates=TOKENS)
    await mk_policy(conn, "a", "llm")
    await mk_policy(conn, "b", "llm")
    return conn


async def test_a_pool_declares_rate_keys_beside_ordinary_ones(llm: asyncpg.Connection) -> None:
    pool = await db_pools.get_pool(llm, "llm")
    assert pool.capacity == {"gpu": 4}
    assert pool.rates["llm_tokens"].amount == 10_000
    assert pool.rates["llm_tokens"].per_seconds == 2
    assert pool.rates["llm_tokens"].used == 0
    assert pool.rates["llm_tokens"].next_refill_at is None


async def test_a_grant_charges_and_release_gives_back_only_ordinary_units(
    llm: asyncpg.Connection,
) -> None:
    r = await mk_req(llm, "a", "llm", resources={"gpu": 1, "llm_tokens": 4000})
    assert r.status == "allocated"
    assert await rate_used(llm, "llm") == 4000
    assert (await db_pools.get_pool(llm, "llm")).usage["llm_tokens"] == 4000
    await release(llm, r.id)
    # The GPU comes back; the tokens stay charged until their window passes.
    assert "gpu" not in await allocated(llm, "llm")
    assert await rate_used(llm, "llm") == 4000
    pool = await db_pools.get_pool(llm, "llm")
    assert pool.rates["llm_tokens"].next_refill_at is not None
    await assert_healthy(llm)


async def test_units_come_back_when_the_window_passes(llm: asyncpg.Connection) -> None:
    first = await mk_req(llm, "a", "llm", resources={"llm_tokens": 8000})
    await release(llm, first.id)
    waiting = await mk_req(llm, "b", "llm", resources={"llm_tokens": 5000})
    assert waiting.status == "queued"
    assert "waiting for llm_tokens" in (await get(llm, waiting.id)).message
    await wait_until_granted(llm, waiting.id, "llm")
    assert await rate_used(llm, "llm") == 5000
    await assert_healthy(llm)


async def test_settlement_refunds_at_the_original_instant(llm: asyncpg.Connection) -> None:
    big = await mk_req(llm, "a", "llm", resources={"llm_tokens": 9000})
    waiting = await mk_req(llm, "b", "llm", resources={"llm_tokens": 3000})
    assert waiting.status == "queued"
    done = await release(llm, big.id, llm_tokens=1200)
    assert done.status == "released"
    # The refund went back at once, and the queue was granted in the same transaction.
    assert await status(llm, waiting.id) == "allocated"
    assert await rate_used(llm, "llm") == 4200
    assert ("allocated", "allocated", "settled") in await events(llm, big.id)
    await assert_healthy(llm)


async def test_release_without_used_leaves_the_estimate(llm: asyncpg.Connection) -> None:
    r = await mk_req(llm, "a", "llm", resources={"llm_tokens": 7000})
    await release(llm, r.id)
    assert await rate_used(llm, "llm") == 7000
    assert [e for e in await events(llm, r.id) if e[2] in ("settled", "overrun")] == []


async def test_an_extra_charge_is_allowed_and_reported(llm: asyncpg.Connection) -> None:
    r = await mk_req(llm, "a", "llm", resources={"llm_tokens": 9000})
    await release(llm, r.id, llm_tokens=12_000)
    pool = await db_pools.get_pool(llm, "llm")
    assert pool.rates["llm_tokens"].used == 12_000
    assert pool.rates["llm_tokens"].overrun == 3000
    history = await db_requests.request_events(llm, r.id)
    over = [e for e in history if e.reason == "overrun"]
    assert len(over) == 1 and "3000 over the estimate" in over[0].message
    nxt = await mk_req(llm, "b", "llm", resources={"llm_tokens": 1})
    assert nxt.status == "queued"  # the window is over its amount until the charge leaves
    # I10 counts the extra as reported: no violation.
    await assert_healthy(llm)


async def test_a_settlement_is_given_once(llm: asyncpg.Connection) -> None:
    r = await mk_req(llm, "a", "llm", resources={"llm_tokens": 5000})
    await release(llm, r.id, llm_tokens=100)
    again = await release(llm, r.id, llm_tokens=100)  # a retried call: unchanged
    assert again.status == "released"
    with pytest.raises(Conflict) as err:
        await release(llm, r.id, llm_tokens=200)
    assert err.value.field == "used.llm_tokens"
    assert await rate_used(llm, "llm") == 100


async def test_limits_and_reserved_shares_apply_per_window(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "llm", {}, rates={"llm_tokens": {"amount": 10_000, "per_seconds": 2}})
    await mk_policy(conn, "team-a", "llm", limit={"llm_tokens": 3000})
    await mk_policy(conn, "team-b", "llm")
    a1 = await mk_req(conn, "team-a", "llm", resources={"llm_tokens": 2000})
    await release(conn, a1.id)
    a2 = await mk_req(conn, "team-a", "llm", resources={"llm_tokens": 2000})
    assert a2.status == "queued"
    assert "subject limit reached" in (await get(conn, a2.id)).message
    b = await mk_req(conn, "team-b", "llm", resources={"llm_tokens": 5000})
    assert b.status == "allocated"
    await wait_until_granted(conn, a2.id, "llm")
    await assert_healthy(conn)


async def test_all_keys_of_a_request_are_admitted_together(llm: asyncpg.Connection) -> None:
    burn = await mk_req(llm, "a", "llm", resources={"llm_tokens": 9500})
    await release(llm, burn.id)
    both = await mk_req(llm, "b", "llm", resources={"gpu": 2, "llm_tokens": 1000})
    assert both.status == "queued"
    assert "gpu" not in await allocated(llm, "llm")  # no GPU held while the tokens are missing
    await wait_until_granted(llm, both.id, "llm")
    assert (await allocated(llm, "llm"))["gpu"] == 2


async def test_rate_keys_never_cause_preemption(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "llm", {"gpu": 2}, rates=TOKENS)
    await mk_policy(conn, "prod", "llm", priority=10, reserved={"gpu": 2, "llm_tokens": 5000})
    await mk_policy(conn, "dev", "llm")
    dev = await mk_req(conn, "dev", "llm", resources={"gpu": 2, "llm_tokens": 9000})
    assert dev.status == "allocated"
    # prod is in share on the GPUs but the window has no tokens for it: it waits; dev keeps
    # its GPUs (taking them would free no token).
    prod = await mk_req(conn, "prod", "llm", resources={"gpu": 1, "llm_tokens": 2000})
    assert prod.status == "queued"
    await reconcile(conn, "llm")
    assert await status(conn, dev.id) == "allocated"
    # A shrunk amount below the window's use preempts nobody either.
    await db_pools.update_pool(conn, "llm", rates={"llm_tokens": {"amount": 9500}})
    await reconcile(conn, "llm")
    assert await status(conn, dev.id) == "allocated"
    await assert_healthy(conn)


async def test_preemption_for_other_keys_still_works(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "llm", {"gpu": 2}, rates=TOKENS)
    await mk_policy(conn, "prod", "llm", reserved={"gpu": 2})
    await mk_policy(conn, "dev", "llm")
    dev = await mk_req(conn, "dev", "llm", resources={"gpu": 2, "llm_tokens": 1000})
    prod = await mk_req(conn, "prod", "llm", resources={"gpu": 1, "llm_tokens": 1000})
    assert prod.status == "queued"
    await reconcile(conn, "llm")
    assert await status(conn, dev.id) == "preempted"
    assert await status(conn, prod.id) == "allocated"
    # dev's tokens stay charged: preemption frees no rate unit.
    assert await rate_used(conn, "llm") == 2000
    await assert_healthy(conn)


async def test_eta_is_exact_for_the_head_and_the_reconciler_knows_when(
    llm: asyncpg.Connection,
) -> None:
    r = await mk_req(llm, "a", "llm", resources={"llm_tokens": 10_000})
    await release(llm, r.id)
    head = await mk_req(llm, "b", "llm", resources={"llm_tokens": 10})
    refill = (await db_pools.get_pool(llm, "llm")).rates["llm_tokens"].next_refill_at
    assert refill is not None
    doc = await get(llm, head.id)
    assert doc.eta is not None and doc.eta.p50_seconds == doc.eta.p90_seconds
    assert doc.eta.p50_seconds in (1, 2)
    rows = await llm.fetch("SELECT pool_id, at FROM respool.rate_refills()")
    assert [(row["pool_id"], row["at"]) for row in rows] == [(await pool_id(llm, "llm"), refill)]


async def test_window_and_amount_changes(llm: asyncpg.Connection) -> None:
    r = await mk_req(llm, "a", "llm", resources={"llm_tokens": 6000})
    await release(llm, r.id)
    await db_pools.update_pool(llm, "llm", rates={"llm_tokens": {"per_seconds": 60}})
    assert await rate_used(llm, "llm") == 6000
    big = await mk_req(llm, "b", "llm", resources={"llm_tokens": 20_000})
    assert big.status == "rejected" and big.reason == "exceeds_capacity"
    pool = await db_pools.update_pool(llm, "llm", rates={"llm_tokens": None})
    assert pool.rates == {} and "llm_tokens" not in pool.usage
    await assert_healthy(llm)


@pytest.mark.parametrize(
    ("rates", "field"),
    [
        ({"llm_tokens": {"amount": 0, "per_seconds": 60}}, "rates.llm_tokens.amount"),
        ({"llm_tokens": {"amount": -5, "per_seconds": 60}}, "rates.llm_tokens.amount"),
        ({"llm_tokens": {"amount": 10**16, "per_seconds": 60}}, "rates.llm_tokens.amount"),
        ({"llm_tokens": {"amount": 5, "per_seconds": 0}}, "rates.llm_tokens.per_seconds"),
        ({"llm_tokens": {"amount": 5, "per_seconds": 86_401}}, "rates.llm_tokens.per_seconds"),
        ({"llm_tokens": {"amount": 5}}, "rates.llm_tokens.per_seconds"),
        ({"llm_tokens": {"amount": 5, "per_seconds": 1, "burst": 2}}, "rates.llm_tokens.burst"),
        ({"Bad": {"amount": 5, "per_seconds": 1}}, "rates.Bad"),
    ],
)
async def test_bad_rates_are_refused_naming_the_field(
    conn: asyncpg.Connection, rates: dict[str, Any], field: str
) -> None:
    with pytest.raises(BadInput) as err:
        await mk_pool(conn, "llm", {"gpu": 1}, rates=rates)
    assert err.value.field == field
    assert await conn.fetchval("SELECT count(*) FROM respool.pools") == 0


async def test_a_key_is_either_counted_or_a_rate(llm: asyncpg.Connection) -> None:
    with pytest.raises(BadInput) as err:
        await db_pools.update_pool(llm, "llm", capacity={"llm_tokens": 5})
    assert err.value.field == "capacity.llm_tokens"
    with pytest.raises(BadInput) as err:
        await db_pools.update_pool(llm, "llm", rates={"gpu": {"amount": 5, "per_seconds": 1}})
    assert err.value.field == "rates.gpu"
    assert (await db_pools.get_pool(llm, "llm")).capacity == {"gpu": 4}


async def node(conn: asyncpg.Connection, body: dict[str, Any]) -> Any:
    return await db_nodes.create_node(conn, body)


async def test_no_rate_on_a_key_nodes_track(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "gpus", {})
    await node(conn, {"name": "n1", "pool": "gpus", "capacity": {"gpu": 2}})
    with pytest.raises(BadInput) as err:
        await db_pools.update_pool(conn, "gpus", rates={"gpu": {"amount": 5, "per_seconds": 1}})
    assert err.value.field == "rates.gpu"
    assert "n1" in str(err.value)
    assert (await db_pools.get_pool(conn, "gpus")).rates == {}


async def test_a_node_may_not_track_a_rate_key(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "gpus", {})
    await db_pools.update_pool(conn, "gpus", rates=TOKENS)
    # the pool's first node joins although the pool has a rate key (its amount is no capacity
    # set by hand)
    await node(conn, {"name": "n1", "pool": "gpus", "capacity": {"gpu": 2}})
    with pytest.raises(BadInput) as err:
        await node(conn, {"name": "n2", "pool": "gpus", "capacity": {"gpu": 1, "llm_tokens": 5}})
    assert err.value.field == "capacity.llm_tokens"
    with pytest.raises(BadInput) as err:
        await db_nodes.update_node(conn, "n1", {"capacity": {"llm_tokens": 5}})
    assert err.value.field == "capacity.llm_tokens"
    # a node outside the pool may track the key; moving it into the pool is refused
    await node(conn, {"name": "n3", "capacity": {"gpu": 1, "llm_tokens": 5}})
    with pytest.raises(BadInput) as err:
        await db_nodes.update_node(conn, "n3", {"pool": "gpus"})
    assert err.value.field == "capacity.llm_tokens"
    pool = await db_pools.get_pool(conn, "gpus")
    assert pool.capacity == {"gpu": 2}
    assert pool.rates["llm_tokens"].amount == 10_000
    assert pool.nodes == 1


async def test_a_pool_with_nodes_takes_rate_keys_no_node_tracks(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "gpus", {})
    await node(conn, {"name": "n1", "pool": "gpus", "capacity": {"gpu": 2}})
    await db_pools.update_pool(conn, "gpus", rates=TOKENS)
    for subject in "abc":
        await mk_policy(conn, subject, "gpus")
    a = await mk_req(conn, "a", "gpus", resources={"gpu": 1, "llm_tokens": 6000})
    b = await mk_req(conn, "b", "gpus", resources={"gpu": 1, "llm_tokens": 6000})
    only_tokens = await mk_req(conn, "c", "gpus", resources={"llm_tokens": 1000})
    got = await get(conn, a.id)
    assert got.status == "allocated", await events(conn, a.id)
    assert got.placement is not None and got.placement.node == "n1"
    # the node counts its GPUs, the pool place the tokens of the window
    assert await conn.fetchval(
        "SELECT jsonb_object_agg(key, used) FROM respool.node_resources nr"
        " JOIN respool.nodes n ON n.id = nr.node_id WHERE n.name = 'n1'"
    ) == {"gpu": 1}
    assert await status(conn, b.id) == "queued"  # a GPU is free, the window's tokens are not
    # tokens alone fit beside (best effort); no node counts them
    assert await status(conn, only_tokens.id) == "allocated"
    assert await rate_used(conn, "gpus") == 7000
    await release(conn, a.id)  # the GPU comes back; the tokens stay charged for the window
    assert await status(conn, b.id) == "queued"
    await wait_until_granted(conn, b.id, "gpus")
    got = await get(conn, b.id)
    assert got.placement is not None and got.placement.node == "n1"
    assert await rate_used(conn, "gpus") in (6000, 7000)  # b's, and c's while it counts
    await assert_healthy(conn)


@pytest.mark.parametrize(
    ("used", "field"),
    [
        ({"gpu": 1}, "used.gpu"),
        ({"llm_tokens": -1}, "used.llm_tokens"),
        ({"other_key": 3}, "used.other_key"),
    ],
)
async def test_bad_settlements_change_nothing(
    llm: asyncpg.Connection, used: dict[str, int], field: str
) -> None:
    r = await mk_req(llm, "a", "llm", resources={"gpu": 1, "llm_tokens": 4000})
    with pytest.raises(BadInput) as err:
        await db_requests.release_request(llm, r.id, used=used)
    assert err.value.field == field
    assert (await get(llm, r.id)).status == "allocated"
    assert await rate_used(llm, "llm") == 4000


async def test_a_request_never_granted_has_nothing_to_settle(llm: asyncpg.Connection) -> None:
    hog = await mk_req(llm, "a", "llm", resources={"llm_tokens": 10_000})
    waiting = await mk_req(llm, "b", "llm", resources={"llm_tokens": 10})
    with pytest.raises(Conflict) as err:
        await db_requests.release_request(llm, waiting.id, used={"llm_tokens": 5})
    assert err.value.field == "used"
    assert await status(llm, waiting.id) == "queued"
    await release(llm, hog.id)


async def test_coalesced_releases_settle_each_member(llm: asyncpg.Connection) -> None:
    one = await mk_req(llm, "a", "llm", resources={"llm_tokens": 3000})
    two = await mk_req(llm, "b", "llm", resources={"llm_tokens": 3000})
    results = await db_requests.release_requests(
        llm, [(one.id, None, {"llm_tokens": 1000}), (two.id, None, {"gpu": 1})]
    )
    assert results[0].status == "released"  # type: ignore[union-attr]
    assert isinstance(results[1], BadInput) and results[1].field == "used.gpu"
    assert await status(llm, two.id) == "allocated"
    assert await rate_used(llm, "llm") == 4000
    await assert_healthy(llm)


async def test_no_invariant_is_broken_by_a_busy_window(llm: asyncpg.Connection) -> None:
    for i in range(30):
        r = await mk_req(llm, "a" if i % 2 else "b", "llm", resources={"llm_tokens": 900})
        if r.status == "allocated":
            await release(llm, r.id, llm_tokens=300 + 50 * (i % 5))
        else:
            await db_requests.cancel_request(llm, r.id)
    assert await db_reconcile.invariant_violations(llm) == []
    assert await rate_used(llm, "llm") <= 10_000


async def test_units_that_come_back_go_to_the_queue_in_order(llm: asyncpg.Connection) -> None:
    hog = await mk_req(llm, "a", "llm", resources={"llm_tokens": 10_000})
    await release(llm, hog.id)
    waiting = await mk_req(llm, "b", "llm", resources={"llm_tokens": 8000})
    assert waiting.status == "queued"
    await asyncio.sleep(2.1)  # the charge has left its window; no reconciler pass ran
    newcomer = await mk_req(llm, "a", "llm", resources={"llm_tokens": 5000})
    # The request that waited got the units first; the newcomer waits behind it.
    assert await status(llm, waiting.id) == "allocated"
    assert newcomer.status == "queued"
    await assert_healthy(llm)
