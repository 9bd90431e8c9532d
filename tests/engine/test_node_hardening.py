"""Node placement rules a user relies on (docs/placement.md, docs/scheduling.md), through the SQL
functions with an explicit clock:

* a gang that no arrangement of the pool's nodes can hold is rejected ``no_fitting_node`` (at
  creation, and when a node change makes a queued gang unplaceable), and an empty pool then
  serves other requests; a gang that fits only in another arrangement than member by member is
  granted;
* the starvation guard of a pool with nodes holds only the nodes its head could use;
* a soft key listed on some nodes only is unbounded on the others, and so on the pool;
* a node selector selects nodes: a pool without nodes is no candidate for a request with one.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from test_placement import Env


@pytest.fixture
def env(conn: asyncpg.Connection) -> Env:
    return Env(conn)


async def _nodes_pool(env: Env, name: str = "gpus", *, starvation: int | None = None) -> None:
    await env.conn.fetchval(
        "SELECT respool.create_pool(p_name => $1, p_capacity => '{}', p_now => $2,"
        " p_starvation_seconds => $3)",
        name,
        env.now(),
        starvation,
    )
    await env.policy("s", name)


def _member(gpu: int, **extra: Any) -> dict[str, Any]:
    return {"subject": "s", "pool": "gpus", "resources": {"gpu": gpu}, **extra}


# --- gangs no arrangement of nodes can hold --------------------------------------------------


async def test_gang_no_arrangement_of_nodes_can_hold_is_rejected(env: Env) -> None:
    await _nodes_pool(env, starvation=0)
    await env.node("n1", "gpus", capacity={"gpu": 8})
    await env.node("n2", "gpus", capacity={"gpu": 8})
    # Each member fits a node and the sum (15) fits the pool (16), but a node holds one member.
    gang = await env.gang([_member(5), _member(5), _member(5)], distinct=False)
    assert [(m["status"], m["reason"]) for m in gang] == [("rejected", "no_fitting_node")] * 3
    assert "no arrangement" in gang[0]["message"]
    # The empty pool serves everything else: nothing is held for the rejected gang.
    a = await env.req("s", "gpus", {"gpu": 8})
    b = await env.req("s", "gpus", {"gpu": 2})
    assert (a["status"], b["status"]) == ("allocated", "allocated")


async def test_gang_with_distinct_nodes_needs_an_arrangement_too(env: Env) -> None:
    await _nodes_pool(env)
    await env.node("big", "gpus", capacity={"gpu": 8})
    await env.node("small", "gpus", capacity={"gpu": 2})
    await env.node("tiny", "gpus", capacity={"gpu": 2})
    # Three nodes for three members, each member fits `big`, but only one member fits there.
    gang = await env.gang([_member(4), _member(4), _member(1)], distinct=True)
    assert {(m["status"], m["reason"]) for m in gang} == {("rejected", "no_fitting_node")}


async def test_large_gang_is_judged_by_a_sound_bound(env: Env) -> None:
    await _nodes_pool(env)
    for i in range(12):
        await env.node(f"n{i:02}", "gpus", capacity={"gpu": 8})
    # 13 members of 5: the pool has 96 GPUs, each member fits a node, a node holds one member.
    gang = await env.gang([_member(5) for _ in range(13)], distinct=False)
    assert {(m["status"], m["reason"]) for m in gang} == {("rejected", "no_fitting_node")}
    # 13 members of 4 fit (two a node): granted.
    ok = await env.gang([_member(4) for _ in range(13)], distinct=False)
    assert {m["status"] for m in ok} == {"allocated"}


async def test_gang_that_fits_only_in_another_arrangement_is_granted(env: Env) -> None:
    await _nodes_pool(env)
    await env.node("n1", "gpus", capacity={"gpu": 8})
    await env.node("n2", "gpus", capacity={"gpu": 8})
    # Member by member (pack) puts 3 and 3 on n1, 5 on n2, and the last 5 nowhere; 3 + 5 on each
    # node holds them all.
    gang = await env.gang([_member(3), _member(3), _member(5), _member(5)], distinct=False)
    assert {m["status"] for m in gang} == {"allocated"}
    assert await env.node_used("n1") == {"gpu": 8}
    assert await env.node_used("n2") == {"gpu": 8}
    placed = [await env.where(m) for m in gang]
    assert sorted(p[0] for p in placed if p) == ["n1", "n1", "n2", "n2"]


async def test_queued_gang_becomes_rejected_when_a_node_change_makes_it_unplaceable(
    env: Env,
) -> None:
    await _nodes_pool(env)
    await env.node("n1", "gpus", capacity={"gpu": 8})
    await env.node("n2", "gpus", capacity={"gpu": 8})
    holder = await env.req("s", "gpus", {"gpu": 8})  # n1 (name order on a tie)
    gang = await env.gang([_member(5), _member(5)], distinct=False)
    assert {m["status"] for m in gang} == {"queued"}
    # n2 shrinks to 4: each member still fits n1, the sum (10) the pool (12), but one node
    # of 5 or more is left for two members.
    await env.update_node("n2", {"capacity": {"gpu": 4}})
    after = [await env.get(m) for m in gang]
    assert {(m["status"], m["reason"]) for m in after} == {("rejected", "no_fitting_node")}
    assert (await env.get(holder))["status"] == "allocated"


# --- the starvation guard on nodes -----------------------------------------------------------


H100 = {"gpu-class": "h100"}
A100 = {"gpu-class": "a100"}


async def _starving_h100_head(
    env: Env, *, h100_gpus: int, holder_gpus: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A starving pool with a 4-GPU a100 node and an ``h100_gpus`` h100 node; an h100 holder of
    ``holder_gpus`` allocated and a 4-GPU h100 head queued behind it, then starving.
    Returns (holder, head)."""
    await _nodes_pool(env, starvation=5)
    await env.node("a100", "gpus", capacity={"gpu": 4}, labels=A100)
    await env.node("h100", "gpus", capacity={"gpu": h100_gpus}, labels=H100)
    holder = await env.req("s", "gpus", {"gpu": holder_gpus}, selector=H100)
    head = await env.req("s", "gpus", {"gpu": 4}, selector=H100)
    assert (holder["status"], head["status"]) == ("allocated", "queued")
    env.tick += 60  # the head starves
    return holder, head


async def test_starving_head_holds_only_the_nodes_it_could_use(env: Env) -> None:
    holder, head = await _starving_h100_head(env, h100_gpus=4, holder_gpus=4)
    # The a100 node's free units are no use to the head: a100 work still starts.
    small = await env.req("s", "gpus", {"gpu": 2}, selector=A100)
    assert small["status"] == "allocated"
    got = await env.get(small)
    assert got["placement"]["node"] == "a100"
    # The hold is still there for the h100 node: once the holder ends the head gets it.
    await env.release(holder)
    assert (await env.get(head))["status"] == "allocated"


async def test_starving_head_still_holds_its_own_node(env: Env) -> None:
    holder, head = await _starving_h100_head(env, h100_gpus=8, holder_gpus=6)
    # A 1-GPU h100 request would leave the h100 node 1 free: held for the head.
    other = await env.req("s", "gpus", {"gpu": 1}, selector=H100)
    assert other["status"] == "queued"
    await env.release(holder)
    assert (await env.get(head))["status"] == "allocated"
    assert (await env.get(other))["status"] == "allocated"


# --- soft keys on some nodes only ------------------------------------------------------------


async def test_soft_key_listed_on_one_node_does_not_cap_the_pool(env: Env) -> None:
    await _nodes_pool(env)
    await env.node("a", "gpus", capacity={"gpu": 4, "mcpu": 4000})
    await env.node("b", "gpus", capacity={"gpu": 4})
    # More mcpu than node a has: b does not list mcpu, so it is unbounded there.
    r = await env.req("s", "gpus", {"gpu": 1, "mcpu": 8000})
    assert r["status"] == "allocated", r["message"]
    assert r["placement"]["node"] == "b"
    # Pinned to a, the same request can never fit.
    pinned = await env.req("s", "gpus", {"gpu": 1, "mcpu": 8000}, selector={"node": "a"})
    assert (pinned["status"], pinned["reason"]) == ("rejected", "no_fitting_node")
    # Once every node lists it, the pool bounds it by their sum again.
    await env.update_node("b", {"capacity": {"gpu": 4, "mcpu": 8000}})
    over = await env.req("s", "gpus", {"gpu": 1, "mcpu": 13000})
    assert (over["status"], over["reason"]) == ("rejected", "exceeds_capacity")


# --- selectors on pools without nodes --------------------------------------------------------


async def _flat_pool(env: Env, name: str = "flat") -> None:
    await env.conn.fetchval(
        "SELECT respool.create_pool(p_name => $1, p_capacity => '{\"gpu\": 4}')", name
    )
    await env.policy("s", name)


@pytest.mark.parametrize(
    ("selector", "settings"),
    [
        ({"gpu-class": "a100"}, None),
        (None, {"gpu_count": 1, "gpu_type": "A100-80G"}),
        (None, {"gpu_count": 1, "gpu_class": "a100"}),
        ({"node": "box-1"}, None),
    ],
)
async def test_selector_on_a_pool_without_nodes_is_rejected(
    env: Env, selector: dict[str, str] | None, settings: dict[str, Any] | None
) -> None:
    await _flat_pool(env)
    r = await env.req(
        "s", "flat", {"gpu": 1} if settings is None else {}, selector=selector, settings=settings
    )
    assert (r["status"], r["reason"]) == ("rejected", "no_fitting_node")
    assert "has no nodes" in r["message"]
    assert await env.conn.fetchval("SELECT used FROM respool.pool_resources WHERE key = 'gpu'") == 0
    # Without a selector the pool serves it as before.
    plain = await env.req("s", "flat", {"gpu": 1})
    assert plain["status"] == "allocated"


async def test_multi_pool_selector_request_skips_pools_without_nodes(env: Env) -> None:
    await _flat_pool(env, "flat")
    await _nodes_pool(env, "nodes")
    await env.node("box", "nodes", capacity={"gpu": 1}, labels={"gpu-class": "a100"})
    a100 = {"gpu-class": "a100"}
    first = await env.req("s", None, {"gpu": 1}, selector=a100)
    second = await env.req("s", None, {"gpu": 1}, selector=a100)
    assert (first["status"], first["pool"]) == ("allocated", "nodes")
    assert first["placement"]["node"] == "box"
    # The plain pool has 4 free GPUs but no node: the second waits for the a100 node.
    assert second["status"] == "queued"
    assert (
        await env.conn.fetchval(
            "SELECT count(*) FROM respool.queue_entries e JOIN respool.pools p ON p.id = e.pool_id"
            " WHERE p.name = 'flat'"
        )
        == 0
    )
    v100 = await env.req("s", None, {"gpu": 1}, selector={"gpu-class": "v100"})
    assert (v100["status"], v100["reason"]) == ("rejected", "no_fitting_node")
    assert "has no nodes" in v100["message"]
    await env.release(first)
    assert (await env.get(second))["status"] == "allocated"
