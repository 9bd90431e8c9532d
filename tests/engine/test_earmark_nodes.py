"""Earmarks follow their node (docs/placement.md, docs/preemption.md): when the node an earmark
holds is cordoned, drained, deleted, moved to another pool or shrunk during the victims' grace
period, the earmark goes, the phantom units stop counting as taken, and the request it was for
reclaims its share on another node instead of waiting for ever. Also: a node's devices turned
anonymous (or named again, same count) preempt nobody; a node capacity of 0 on create is refused.

Through the SQL functions with an explicit clock, read back from the request documents.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from test_placement import Env

GRACE = 30


@pytest.fixture
def env(conn: asyncpg.Connection) -> Env:
    return Env(conn)


async def _status(env: Env, doc: dict[str, Any]) -> str:
    got = await env.get(doc)
    status: str = got["status"]
    return status


async def _earmarked_units(env: Env, pool: str) -> int:
    """Units the pool counts as earmarked (what a grant competes with besides the counters)."""
    n: int = await env.conn.fetchval(
        "SELECT coalesce(sum(u.earmarked), 0) FROM respool._usage("
        " (SELECT id FROM respool.pools WHERE name = $1)) u"
        " WHERE u.policy_id IS NULL AND u.key = 'gpu'",
        pool,
    )
    return n


async def _past_grace(env: Env, pool: str) -> None:
    """Reconciler passes past two grace periods: the one running, and that of the victims a
    pass may preempt then (each pass one second later)."""
    for _ in range(2):
        env.tick += GRACE + 1
        for _ in range(2):
            await env.reconcile(pool)


async def _earmarked_on_n1(
    env: Env, *, gpus: bool = True, extra_nodes: tuple[str, ...] = ("n2",)
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Pool ``gpus`` (grace GRACE) with 4-gpu nodes n1 and ``extra_nodes``; ``owner`` reserves 4
    gpus, ``borrower`` fills every node; a reclaim pass preempts the borrower on n1 and earmarks
    n1 for the owner. Returns (the owner's request, the borrower's request per node)."""
    await env.pool("gpus", grace=GRACE)
    for name in ("n1", *extra_nodes):
        if gpus:
            await env.node(name, "gpus", gpus=["0", "1", "2", "3"])
        else:
            await env.node(name, "gpus", capacity={"gpu": 4})
    await env.pool("other")
    await env.policy("owner", "gpus", reserved={"gpu": 4})
    await env.policy("borrower", "gpus", priority=1)
    held = {
        name: await env.req("borrower", "gpus", {"gpu": 4}, selector={"node": name})
        for name in ("n1", *extra_nodes)
    }
    owner = await env.req("owner", "gpus", {"gpu": 4})
    assert owner["status"] == "queued"
    await env.reconcile("gpus")
    assert await _status(env, held["n1"]) == "preempting"
    got = await env.get(owner)
    assert got["status"] == "queued"
    assert got["message"].startswith("preempted units are being released for it")
    assert await _earmarked_units(env, "gpus") == 4
    return owner, held


async def _reclaimed_on_n2(
    env: Env, owner: dict[str, Any], held: dict[str, dict[str, Any]]
) -> None:
    """After the change settles, the owner has its share, on n2, taken from the borrower there."""
    await _past_grace(env, "gpus")
    got = await env.get(owner)
    assert got["status"] == "allocated", got["message"]
    assert got["placement"]["node"] == "n2"
    assert await _status(env, held["n2"]) == "preempted"
    assert await _status(env, held["n1"]) == "preempted"
    assert await _earmarked_units(env, "gpus") == 0
    violations = await env.conn.fetch("SELECT * FROM respool.invariant_violations")
    assert violations == []


@pytest.mark.parametrize("state", ["cordoned", "draining"])
async def test_cordon_or_drain_of_the_earmarked_node_moves_the_reclaim(
    env: Env, state: str
) -> None:
    owner, held = await _earmarked_on_n1(env)
    await env.state("n1", state)
    # The earmark went with the node's active state: nothing counts as earmarked any more...
    assert await _earmarked_units(env, "gpus") == 0
    got = await env.get(owner)
    assert "being released for it" not in got["message"]
    # ... and the owner's share is reclaimed on n2.
    await _reclaimed_on_n2(env, owner, held)


async def test_forced_delete_of_the_earmarked_node_moves_the_reclaim(env: Env) -> None:
    owner, held = await _earmarked_on_n1(env)
    await env.conn.execute("SELECT respool.delete_node('n1', true, $1)", env.now())
    assert await _status(env, held["n1"]) == "preempted"  # removed with its node, no grace
    assert await _earmarked_units(env, "gpus") == 0
    got = await env.get(owner)
    assert got["status"] == "queued"
    assert "being released for it" not in got["message"]
    await _reclaimed_on_n2(env, owner, held)


async def test_forced_move_of_the_earmarked_node_moves_the_reclaim(env: Env) -> None:
    owner, held = await _earmarked_on_n1(env)
    await env.conn.fetchval(
        "SELECT respool.update_node('n1', $1, true, $2)", {"pool": "other"}, env.now()
    )
    assert await _earmarked_units(env, "gpus") == 0
    assert "being released for it" not in (await env.get(owner))["message"]
    await _reclaimed_on_n2(env, owner, held)


async def test_shrink_of_the_earmarked_node_below_the_need_moves_the_reclaim(env: Env) -> None:
    owner, held = await _earmarked_on_n1(env, gpus=False)
    await env.update_node("n1", {"capacity": {"gpu": 2}})
    assert await _earmarked_units(env, "gpus") == 0
    await _reclaimed_on_n2(env, owner, held)


async def test_shrink_that_leaves_the_earmarked_node_no_room_moves_the_reclaim(env: Env) -> None:
    """n1 has 8 anonymous gpus: a non-preemptible holder of 4 and the victim of 4; it shrinks to
    4. Usage net of the victim fits (nothing to shed) and n1 could still hold the owner when
    empty, but once the victim is gone there is no room: the owner must not wait for ever."""
    await env.pool("gpus", grace=GRACE)
    await env.node("n1", "gpus", capacity={"gpu": 8})
    await env.node("n2", "gpus", capacity={"gpu": 4})
    await env.policy("owner", "gpus", reserved={"gpu": 4})
    await env.policy("keeper", "gpus", reserved={"gpu": 4})
    await env.policy("borrower", "gpus", priority=1)
    keeper = await env.req("keeper", "gpus", {"gpu": 4}, preemptible=False, selector={"node": "n1"})
    held = {
        "n1": await env.req("borrower", "gpus", {"gpu": 4}, selector={"node": "n1"}),
        "n2": await env.req("borrower", "gpus", {"gpu": 4}, selector={"node": "n2"}),
    }
    assert keeper["status"] == "allocated"
    owner = await env.req("owner", "gpus", {"gpu": 4})
    await env.reconcile("gpus")
    assert await _status(env, held["n1"]) == "preempting"  # fewest victims, then name: n1
    await env.update_node("n1", {"capacity": {"gpu": 4}})
    await _reclaimed_on_n2(env, owner, held)
    assert await _status(env, keeper) == "allocated"


async def test_three_nodes_cordon_then_the_next_node_is_taken(env: Env) -> None:
    owner, held = await _earmarked_on_n1(env, extra_nodes=("n2", "n3"))
    await env.state("n1", "cordoned")
    await _past_grace(env, "gpus")
    got = await env.get(owner)
    assert got["status"] == "allocated", got["message"]
    assert got["placement"]["node"] == "n2"  # fewest victims tie: the node's name
    assert [await _status(env, held[n]) for n in ("n1", "n2", "n3")] == [
        "preempted",
        "preempted",
        "allocated",
    ]


async def test_an_earmark_on_an_intact_node_still_holds_it(env: Env) -> None:
    """The earmark still does its job when nothing happens to its node: a third request does
    not take the victim's units, and the owner gets n1 when the victim releases."""
    owner, held = await _earmarked_on_n1(env)
    third = await env.req("borrower", "gpus", {"gpu": 1})
    await env.reconcile("gpus")
    assert await _earmarked_units(env, "gpus") == 4
    await env.release(held["n1"])
    assert await env.where(owner) == ("n1", ["0", "1", "2", "3"])
    assert await _status(env, third) == "queued"
    assert await _status(env, held["n2"]) == "allocated"


async def test_uncordon_during_grace_keeps_the_reclaim_going(env: Env) -> None:
    """Cordon then uncordon n1 within the grace period: whatever the earmark did, the owner
    ends allocated and no request waits with units it could reclaim."""
    owner, held = await _earmarked_on_n1(env)
    await env.state("n1", "cordoned")
    await env.reconcile("gpus")
    await env.state("n1", "active")
    await _past_grace(env, "gpus")
    got = await env.get(owner)
    assert got["status"] == "allocated", got["message"]
    assert await _earmarked_units(env, "gpus") == 0


# --- device lists turned anonymous, or named again ----------------------------------------------


async def _two_holders(env: Env, **node: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pool ``gpus`` with node n1 (``node``: its capacity or gpus); ``s`` reserves 2 gpus and
    holds 2 preemptible gpus, then 2 non-preemptible ones."""
    await env.pool("gpus", grace=GRACE)
    await env.node("n1", "gpus", **node)
    await env.policy("s", "gpus", reserved={"gpu": 2})
    pre = await env.req("s", "gpus", {"gpu": 2})
    keep = await env.req("s", "gpus", {"gpu": 2}, preemptible=False)
    assert [pre["status"], keep["status"]] == ["allocated", "allocated"]
    return pre, keep


async def _preemptions(env: Env) -> int:
    n: int = await env.conn.fetchval(
        "SELECT count(*) FROM respool.events WHERE to_status IN ('preempting', 'preempted')"
    )
    return n


async def test_named_devices_turned_anonymous_preempt_nobody(env: Env) -> None:
    pre, keep = await _two_holders(env, gpus=["0", "1", "2", "3"])
    await env.update_node("n1", {"devices": {"gpu": None}})
    await env.reconcile("gpus")
    for doc in (pre, keep):
        got = await env.get(doc)
        assert got["status"] == "allocated"
        assert got["placement"]["node"] == "n1"
        assert got["placement"]["devices"] == {}  # the units are anonymous now
    assert await _preemptions(env) == 0
    assert await env.node_used("n1") == {"gpu": 4}
    node = await env.conn.fetchval("SELECT respool.get_node('n1')")
    assert node["capacity"] == {"gpu": 4}
    assert node["devices"] == {}
    assert await env.conn.fetch("SELECT * FROM respool.invariant_violations") == []


async def test_anonymous_units_named_with_as_many_ids_preempt_nobody(env: Env) -> None:
    pre, keep = await _two_holders(env, capacity={"gpu": 4})
    await env.update_node("n1", {"devices": {"gpu": ["a", "b", "c", "d"]}})
    await env.reconcile("gpus")
    held = {}
    for doc in (pre, keep):
        got = await env.get(doc)
        assert got["status"] == "allocated"
        held[doc["id"]] = got["placement"]["devices"]["gpu"]
    assert sorted(held[pre["id"]] + held[keep["id"]]) == ["a", "b", "c", "d"]
    assert await _preemptions(env) == 0
    assert await env.conn.fetch("SELECT * FROM respool.invariant_violations") == []


async def test_naming_fewer_ids_than_units_held_keeps_the_non_preemptible_holder(
    env: Env,
) -> None:
    """Anonymous 4 gpus, both holders at 2; naming only 2 ids removes 2 units at once: the
    holder the victim order takes first (preemptible) goes, the non-preemptible one keeps its
    units, on the named devices."""
    pre, keep = await _two_holders(env, capacity={"gpu": 4})
    await env.update_node("n1", {"devices": {"gpu": ["x", "y"]}})
    assert await _status(env, pre) == "preempted"
    got = await env.get(keep)
    assert got["status"] == "allocated"
    assert got["placement"]["devices"] == {"gpu": ["x", "y"]}
    assert await env.conn.fetch("SELECT * FROM respool.invariant_violations") == []
