"""Shrink enforcement (docs/preemption.md): key removal, several keys over at once, and the
allocation a raised limit or reserved share triggers (docs/admission.md).

Each test reproduces one report verbatim, runs one reconcile pass and asserts who is preempted,
then that every invariant holds again.
"""

from __future__ import annotations

import asyncpg
from engine_support import assert_healthy, get, mk_policy, mk_pool, mk_req, reconcile, statuses

from app.db import policies as db_policies
from app.db import pools as db_pools
from app.db import reconcile as db_reconcile


async def test_removing_a_custom_key_preempts_its_holders(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "a", {"gpu": 2, "lic": 1})
    await mk_policy(conn, "s", "a")
    r = await mk_req(conn, "s", "a", resources={"lic": 1})
    assert r.status == "allocated"
    await db_pools.update_pool(conn, "a", capacity={"lic": 0})
    # A missing row is capacity 0 for a custom key: the holder is over it until preempted.
    assert [(v.invariant, v.key) for v in await db_reconcile.invariant_violations(conn)] == [
        ("I1", "lic")
    ]
    doc = await reconcile(conn, "a")
    assert doc["preempted"] == 1
    got = await get(conn, r.id)
    assert (got.status, got.reason) == ("preempted", "capacity_shrink")
    assert got.message == "preempted: pool capacity of lic shrank to 0"
    await assert_healthy(conn)


async def test_removing_gpu_preempts_its_holders_but_not_others(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "a", {"gpu": 2, "lic": 2})
    await mk_policy(conn, "s", "a")
    g = await mk_req(conn, "s", "a", resources={"gpu": 1})
    lic = await mk_req(conn, "s", "a", resources={"lic": 1})
    await db_pools.update_pool(conn, "a", capacity={"gpu": 0})
    assert (await reconcile(conn, "a"))["preempted"] == 1
    assert await statuses(conn, g.id, lic.id) == ["preempted", "allocated"]
    await assert_healthy(conn)


async def test_removing_a_soft_key_makes_it_untracked_without_preemption(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool(conn, "a", {"gpu": 4, "mcpu": 1000, "step_run": 1})
    await mk_policy(conn, "s", "a")
    r = await mk_req(conn, "s", "a", resources={"gpu": 1, "mcpu": 1000})
    await db_pools.update_pool(conn, "a", capacity={"mcpu": 0, "step_run": 0})
    assert (await reconcile(conn, "a"))["preempted"] == 0
    assert (await get(conn, r.id)).status == "allocated"
    # Untracked now: a second request is not held back by mcpu or step_run.
    r2 = await mk_req(conn, "s", "a", resources={"gpu": 1, "mcpu": 5000})
    assert r2.status == "allocated"
    await assert_healthy(conn)


async def test_limit_lowered_on_two_keys_preempts_only_what_is_needed(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool(conn, "d", {"gpu": 6})
    pol = await mk_policy(conn, "s", "d", limit={"gpu": 5, "step_run": 5})
    x = await mk_req(conn, "s", "d", resources={"gpu": 2})
    y = await mk_req(conn, "s", "d", resources={"gpu": 1})
    assert [x.status, y.status] == ["allocated", "allocated"]
    await db_policies.update_policy(conn, str(pol.id), limit={"gpu": 2, "step_run": 1})
    doc = await reconcile(conn, "d")
    # Preempting y (the newest) alone makes both keys fit: gpu 2/2, step_run 1/1.
    assert doc["preempted"] == 1
    assert await statuses(conn, x.id, y.id) == ["allocated", "preempted"]
    got = await get(conn, y.id)
    assert got.reason == "limit_shrink"
    assert got.message == (
        "preempted: the limit of s on gpu was lowered to 2, step_run was lowered to 1"
    )
    await assert_healthy(conn)


async def test_capacity_shrunk_on_two_keys_preempts_only_what_is_needed(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool(conn, "d", {"gpu": 6, "tpu": 4})
    await mk_policy(conn, "s", "d")
    x = await mk_req(conn, "s", "d", resources={"gpu": 2, "tpu": 2})
    y = await mk_req(conn, "s", "d", resources={"gpu": 2, "tpu": 2})
    # gpu 4 > 3 and tpu 4 > 3: y (the newest) alone pays both excesses.
    await db_pools.update_pool(conn, "d", capacity={"gpu": 3, "tpu": 3})
    assert (await reconcile(conn, "d"))["preempted"] == 1
    assert await statuses(conn, x.id, y.id) == ["allocated", "preempted"]
    await assert_healthy(conn)


async def test_multi_key_shrink_keeps_the_set_minimal(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "d", {"gpu": 4, "tpu": 4})
    await mk_policy(conn, "s", "d")
    a = await mk_req(conn, "s", "d", resources={"gpu": 2, "tpu": 2})
    b = await mk_req(conn, "s", "d", resources={"tpu": 1})
    c = await mk_req(conn, "s", "d", resources={"gpu": 1})
    # gpu 3 > 2 and tpu 3 > 1: the walk takes c (gpu), b (tpu), then a (gpu 2, tpu 2), after
    # which c and b are not needed any more: a alone makes every key fit.
    await db_pools.update_pool(conn, "d", capacity={"gpu": 2, "tpu": 1})
    assert (await reconcile(conn, "d"))["preempted"] == 1
    assert await statuses(conn, a.id, b.id, c.id) == ["preempted", "allocated", "allocated"]
    await assert_healthy(conn)


async def test_raising_a_limit_grants_in_the_same_transaction(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 4})
    pol = await mk_policy(conn, "s", "p", limit={"gpu": 1})
    first = await mk_req(conn, "s", "p", resources={"gpu": 1})
    waiting = await mk_req(conn, "s", "p", resources={"gpu": 1})
    assert [first.status, waiting.status] == ["allocated", "queued"]
    await db_policies.update_policy(conn, str(pol.id), limit={"gpu": 2})
    assert (await get(conn, waiting.id)).status == "allocated"
    await assert_healthy(conn)


async def test_raising_a_reserved_share_grants_in_the_same_transaction(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool(conn, "p", {"gpu": 4})
    pol = await mk_policy(conn, "s", "p", reserved={"gpu": 2})
    first = await mk_req(conn, "s", "p", resources={"gpu": 2}, preemptible=False)
    waiting = await mk_req(conn, "s", "p", resources={"gpu": 1}, preemptible=False)
    assert [first.status, waiting.status] == ["allocated", "queued"]
    await db_policies.update_policy(conn, str(pol.id), reserved={"gpu": 3})
    assert (await get(conn, waiting.id)).status == "allocated"
    await assert_healthy(conn)
