"""Placement on nodes and devices (docs/placement.md), through the SQL functions with an explicit
clock (``p_now``), read back from the request documents and the node tables.

What a user of a pool backed by nodes checks: a grant lands on one node and on the first free
device ids in the node's list order; pack and spread pick the node; selectors (and the built-in
``node`` label, and settings ``gpu_type``/``gpu_class``) restrict it; cordoned and draining nodes
take no new grants; requests no node could ever hold are rejected ``no_fitting_node``; a request
never spans nodes; gangs are placed member by member (``distinct_nodes``: one per node), all or
none; reclaim preempts on one node only, the one with the smallest victim set; an earmark holds
the node through a grace period; drain and node shrinks preempt on that node only. The last test
runs creates and releases on several real connections at once.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import asyncpg
import pytest

from app.db.connect import APP_CLI, connect
from support.churn import churn
from support.db import RECONCILE_POOL, ClockedConn
from support.placement import gpu_placement

CLOCK0 = ClockedConn.clock0


class Env(ClockedConn):
    """One database connection and a clock that moves one second per call."""

    async def pool(self, name: str, *, placement: str = "pack", grace: int = 0) -> None:
        await self.conn.fetchval(
            "SELECT respool.create_pool(p_name => $1, p_capacity => '{}', p_placement => $2,"
            " p_preemption_grace_seconds => $3, p_now => $4)",
            name,
            placement,
            grace,
            self.now(),
        )

    async def policy(
        self,
        subject: str,
        pool: str,
        *,
        priority: int = 0,
        reserved: dict[str, int] | None = None,
    ) -> None:
        await self.conn.fetchval(
            "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_priority => $3,"
            " p_reserved => $4, p_now => $5)",
            subject,
            pool,
            priority,
            reserved or {},
            self.now(),
        )

    async def node(
        self,
        name: str,
        pool: str | None,
        *,
        capacity: dict[str, int] | None = None,
        gpus: list[str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "pool": pool, "labels": labels or {}}
        if capacity:
            body["capacity"] = capacity
        if gpus is not None:
            body["devices"] = {"gpu": gpus}
        doc: dict[str, Any] = await self.conn.fetchval(
            "SELECT respool.create_node($1, p_now => $2)", body, self.now()
        )
        return doc

    async def update_node(self, name: str, body: dict[str, Any]) -> None:
        await self.conn.fetchval(
            "SELECT respool.update_node($1, $2, p_now => $3)", name, body, self.now()
        )

    async def state(self, name: str, state: str) -> None:
        await self.conn.fetchval(
            "SELECT respool.set_node_state($1, $2, p_now => $3)", name, state, self.now()
        )

    async def req(
        self,
        subject: str,
        pool: str | None,
        resources: dict[str, int],
        *,
        selector: dict[str, str] | None = None,
        settings: dict[str, Any] | None = None,
        preemptible: bool = True,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "subject": subject,
            "pool": pool,
            "resources": resources,
            "preemptible": preemptible,
        }
        if selector is not None:
            body["node_selector"] = selector
        if settings is not None:
            body["settings"] = settings
        doc: dict[str, Any] = await self.conn.fetchval(
            "SELECT request FROM respool.create_request($1, p_now => $2)", body, self.now()
        )
        return doc

    async def gang(self, members: list[dict[str, Any]], *, distinct: bool) -> list[dict[str, Any]]:
        rows = await self.conn.fetch(
            "SELECT request FROM respool.create_requests($1, p_all_or_nothing => true,"
            " p_now => $2, p_distinct_nodes => $3) ORDER BY member",
            members,
            self.now(),
            distinct,
        )
        return [r["request"] for r in rows]

    async def reconcile(self, pool: str) -> None:
        await self.conn.fetchval(RECONCILE_POOL, pool, self.now())

    async def where(self, doc: dict[str, Any]) -> tuple[str, list[str]] | None:
        """(node, gpu device ids) of a request as its document shows it; None: not placed."""
        got = await self.get(doc)
        p = got["placement"]
        return None if p is None else (p["node"], p["devices"].get("gpu", []))

    async def node_used(self, node: str) -> dict[str, int]:
        rows = await self.conn.fetch(
            "SELECT nr.key, nr.used FROM respool.node_resources nr"
            " JOIN respool.nodes n ON n.id = nr.node_id WHERE n.name = $1 AND nr.used <> 0",
            node,
        )
        return {r["key"]: r["used"] for r in rows}

    async def held_devices(self, node: str) -> list[str]:
        rows = await self.conn.fetch(
            "SELECT d.device FROM respool.node_devices d JOIN respool.nodes n ON n.id = d.node_id"
            " WHERE n.name = $1 AND d.holder_id IS NOT NULL ORDER BY d.position",
            node,
        )
        return [r["device"] for r in rows]


@pytest.fixture
def env(conn: asyncpg.Connection) -> Env:
    return Env(conn)


GPUS8 = [str(i) for i in range(8)]


async def _one_pool(env: Env, placement: str = "pack", grace: int = 0) -> None:
    await env.pool("gpus", placement=placement, grace=grace)
    await env.policy("s", "gpus")


# --- where a grant lands -------------------------------------------------------------------------


async def test_grant_lands_on_one_node_first_free_devices_in_list_order(env: Env) -> None:
    await _one_pool(env)
    await env.node("n1", "gpus", gpus=["3", "1", "0", "2"], labels={"gpu-type": "A100"})
    a = await env.req("s", "gpus", {"gpu": 2})
    assert a["status"] == "allocated"
    assert a["placement"] == gpu_placement("n1", ["3", "1"], labels={"gpu-type": "A100"})
    b = await env.req("s", "gpus", {"gpu": 1})
    assert await env.where(b) == ("n1", ["0"])
    await env.release(a)
    # Released devices come back: the next grant takes the first free ones in list order again.
    assert await env.held_devices("n1") == ["0"]
    assert await env.node_used("n1") == {"gpu": 1}
    c = await env.req("s", "gpus", {"gpu": 3})
    assert await env.where(c) == ("n1", ["3", "1", "2"])
    # A finished request carries no placement.
    assert (await env.get(a))["placement"] is None
    await env.release(b)
    await env.release(c)
    assert await env.held_devices("n1") == []
    assert await env.node_used("n1") == {}


# A pool with node big (8 GPUs) and node small (4): (GPUs asked, where each request lands).
PLACEMENTS = {
    # pack takes the node left with the fewest free device units
    "pack": [
        (2, ("small", ["0", "1"])),
        (3, ("big", ["0", "1", "2"])),  # small has 2 free: does not fit there
        (2, ("small", ["2", "3"])),  # small 2 free, big 5 free: small
    ],
    # spread takes the node with the most free device units
    "spread": [
        (2, ("big", ["0", "1"])),
        (2, ("big", ["2", "3"])),  # big 6 free, small 4 free
        (2, ("big", ["4", "5"])),  # big 4, small 4: tie -> all keys tie -> name
        (1, ("small", ["0"])),  # big 2, small 4
    ],
}


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
async def test_each_placement_mode_picks_its_node(env: Env, placement: str) -> None:
    await _one_pool(env, placement)
    await env.node("big", "gpus", gpus=GPUS8)
    await env.node("small", "gpus", gpus=["0", "1", "2", "3"])
    for gpus, where in PLACEMENTS[placement]:
        assert await env.where(await env.req("s", "gpus", {"gpu": gpus})) == where


@pytest.mark.parametrize(("placement", "expected"), [("pack", "lean"), ("spread", "fat")])
async def test_tie_on_device_keys_is_broken_by_free_units_over_all_keys(
    env: Env, placement: str, expected: str
) -> None:
    await _one_pool(env, placement)
    # Same free gpus; fat has more free mcpu than lean. Names chosen so that the name order
    # (fat < lean) alone would give the wrong answer for pack.
    await env.node("fat", "gpus", capacity={"mcpu": 16000}, gpus=["0", "1"])
    await env.node("lean", "gpus", capacity={"mcpu": 4000}, gpus=["0", "1"])
    a = await env.req("s", "gpus", {"gpu": 1, "mcpu": 1000})
    assert (await env.where(a) or ("?",))[0] == expected


async def test_choice_looks_at_what_a_node_is_left_with(env: Env) -> None:
    """Nodes may name devices for a key or not: the choice compares what each node is left
    with once the request is placed, not what is free before."""
    await _one_pool(env, "spread")
    await env.node("named", "gpus", capacity={"mcpu": 4000}, gpus=["a", "b"])
    await env.node("plain", "gpus", capacity={"mcpu": 4000, "gpu": 2})  # anonymous gpus
    a = await env.req("s", "gpus", {"gpu": 1})  # left with: named 1 device unit, plain none
    assert await env.where(a) == ("named", ["a"])
    # Left with: named 0 device units, plain none (ties); over all keys named 0, plain 1.
    b = await env.req("s", "gpus", {"gpu": 1})
    assert await env.where(b) == ("plain", [])


async def test_full_tie_goes_to_the_node_name(env: Env) -> None:
    await _one_pool(env, "pack")
    await env.node("n2", "gpus", gpus=["0", "1"])
    await env.node("n1", "gpus", gpus=["0", "1"])
    a = await env.req("s", "gpus", {"gpu": 1})
    assert await env.where(a) == ("n1", ["0"])


# --- selectors -------------------------------------------------------------------------------


async def test_node_selector_and_the_builtin_node_label(env: Env) -> None:
    await _one_pool(env)
    await env.node("a100", "gpus", gpus=GPUS8, labels={"gpu-type": "A100-80G"})
    await env.node("h100", "gpus", gpus=["0", "1", "2", "3"], labels={"gpu-type": "H100"})
    # Pack would take h100 (fewer free); the selector asks for an A100.
    a = await env.req("s", "gpus", {"gpu": 1}, selector={"gpu-type": "A100-80G"})
    assert a["node_selector"] == {"gpu-type": "A100-80G"}
    assert await env.where(a) == ("a100", ["0"])
    b = await env.req("s", "gpus", {"gpu": 1}, selector={"node": "a100"})
    assert await env.where(b) == ("a100", ["1"])
    # Every pair must match.
    c = await env.req("s", "gpus", {"gpu": 1}, selector={"node": "a100", "gpu-type": "H100"})
    assert (c["status"], c["reason"]) == ("rejected", "no_fitting_node")


async def test_settings_gpu_type_and_gpu_class_become_selector_labels(env: Env) -> None:
    await _one_pool(env)
    await env.node("x", "gpus", gpus=["0", "1"], labels={"gpu-type": "L4", "gpu-class": "small"})
    await env.node("y", "gpus", gpus=GPUS8, labels={"gpu-type": "A100", "gpu-class": "large"})
    a = await env.req("s", "gpus", {}, settings={"gpu_count": 2, "gpu_type": "A100"})
    assert a["node_selector"] == {"gpu-type": "A100"}
    assert a["resources"]["gpu"] == 2
    assert await env.where(a) == ("y", ["0", "1"])
    b = await env.req("s", "gpus", {}, settings={"gpu_count": 1, "gpu_class": "large"})
    assert b["node_selector"] == {"gpu-class": "large"}
    assert await env.where(b) == ("y", ["2"])
    c = await env.req("s", "gpus", {}, settings={"gpu_count": 1, "gpu_type": "H100"})
    assert (c["status"], c["reason"]) == ("rejected", "no_fitting_node")


# --- node states -----------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["cordoned", "draining"])
async def test_cordoned_and_draining_nodes_take_no_new_grants(env: Env, state: str) -> None:
    await _one_pool(env)
    await env.node("n1", "gpus", gpus=["0", "1"])
    await env.node("n2", "gpus", gpus=["0", "1", "2", "3"])
    held = await env.req("s", "gpus", {"gpu": 1}, selector={"node": "n1"})
    assert await env.where(held) == ("n1", ["0"])
    await env.state("n1", state)
    # n1 has room and pack would pick it; it takes nothing new.
    a = await env.req("s", "gpus", {"gpu": 1})
    assert await env.where(a) == ("n2", ["0"])
    pinned = await env.req("s", "gpus", {"gpu": 1}, selector={"node": "n1"})
    assert pinned["status"] == "queued"  # it could run there later: not rejected
    await env.reconcile("gpus")
    assert (await env.get(pinned))["status"] == "queued"
    if state == "cordoned":
        # Holders of a cordoned node keep their units.
        assert await env.where(held) == ("n1", ["0"])
    await env.state("n1", "active")  # uncordon: grants what now fits
    assert (await env.where(pinned) or ("?",))[0] == "n1"


async def test_drain_preempts_preemptible_holders_only(env: Env) -> None:
    await env.pool("gpus")
    await env.node("n1", "gpus", gpus=["0", "1", "2", "3"])
    await env.node("n2", "gpus", gpus=["0", "1", "2", "3"])
    await env.policy("s", "gpus", reserved={"gpu": 2})  # reserved: once the pool tracks gpu
    p = await env.req("s", "gpus", {"gpu": 1}, selector={"node": "n1"})
    np_ = await env.req("s", "gpus", {"gpu": 2}, selector={"node": "n1"}, preemptible=False)
    other = await env.req("s", "gpus", {"gpu": 1}, selector={"node": "n2"})
    await env.state("n1", "draining")
    await env.reconcile("gpus")
    p_now = await env.get(p)
    assert (p_now["status"], p_now["reason"]) == ("preempted", "node_drain")
    assert await env.where(np_) == ("n1", ["1", "2"])  # non-preemptible: finishes on its own
    assert await env.where(other) == ("n2", ["0"])  # another node: untouched
    assert await env.held_devices("n1") == ["1", "2"]
    assert await env.node_used("n1") == {"gpu": 2}


# --- rejections ------------------------------------------------------------------------------


async def test_no_fitting_node_rejections(env: Env) -> None:
    await _one_pool(env)
    await env.node("n1", "gpus", gpus=GPUS8, labels={"gpu-type": "A100"})
    await env.node("n2", "gpus", gpus=GPUS8, labels={"gpu-type": "A100"})
    await env.node("n3", "gpus", gpus=["0", "1"], labels={"gpu-type": "L4"})
    await env.state("n2", "cordoned")  # a node in any state counts for "could ever hold it"
    # No node matches.
    a = await env.req("s", "gpus", {"gpu": 1}, selector={"gpu-type": "H100"})
    assert (a["status"], a["reason"]) == ("rejected", "no_fitting_node")
    # Above every matching node although the pool has 18 gpus.
    b = await env.req("s", "gpus", {"gpu": 3}, selector={"gpu-type": "L4"})
    assert (b["status"], b["reason"]) == ("rejected", "no_fitting_node")
    # A request never spans nodes: 16 of the pool's 18 gpus, on two 8-gpu nodes.
    c = await env.req("s", "gpus", {"gpu": 16})
    assert (c["status"], c["reason"]) == ("rejected", "no_fitting_node")
    # Above the pool's capacity: the pool rule first.
    d = await env.req("s", "gpus", {"gpu": 19})
    assert (d["status"], d["reason"]) == ("rejected", "exceeds_capacity")
    # 8 fits n1 (and n2, cordoned, could hold it later).
    e = await env.req("s", "gpus", {"gpu": 8}, selector={"gpu-type": "A100"})
    assert await env.where(e) == ("n1", GPUS8)


async def test_no_node_could_hold_every_key_at_once_is_rejected(env: Env) -> None:
    """Each key fits some node, but no node could hold all of them at once: the request could
    never run (it never spans nodes), so it is rejected, not left waiting forever."""
    await _one_pool(env)
    await env.node("gpu-box", "gpus", capacity={"mcpu": 8000}, gpus=["0", "1", "2", "3"])
    await env.node("cpu-box", "gpus", capacity={"mcpu": 16000})
    a = await env.req("s", "gpus", {"gpu": 1, "mcpu": 9000})
    assert (a["status"], a["reason"]) == ("rejected", "no_fitting_node")
    b = await env.req("s", "gpus", {"gpu": 1, "mcpu": 8000})
    assert await env.where(b) == ("gpu-box", ["0"])
    # distinct_nodes: two matching nodes, but only one could hold a member.
    member = {"subject": "s", "pool": "gpus", "resources": {"gpu": 1}}
    docs = await env.gang([member] * 2, distinct=True)
    assert [(d["status"], d["reason"]) for d in docs] == [("rejected", "no_fitting_node")] * 2


async def test_a_request_never_spans_nodes(env: Env) -> None:
    await _one_pool(env)
    await env.node("n1", "gpus", gpus=GPUS8)
    await env.node("n2", "gpus", gpus=GPUS8)
    pool_capacity = await env.conn.fetchval(
        "SELECT pr.capacity FROM respool.pool_resources pr"
        " JOIN respool.pools p ON p.id = pr.pool_id WHERE p.name = 'gpus' AND pr.key = 'gpu'"
    )
    assert pool_capacity == 16
    big = await env.req("s", "gpus", {"gpu": 16})
    assert (big["status"], big["reason"]) == ("rejected", "no_fitting_node")
    # 5 + 5 on the two nodes leaves 3 + 3 free: a 6 waits (no node has 6), never split.
    await env.req("s", "gpus", {"gpu": 5}, selector={"node": "n1"})
    await env.req("s", "gpus", {"gpu": 5}, selector={"node": "n2"})
    six = await env.req("s", "gpus", {"gpu": 6})
    assert six["status"] == "queued"
    await env.reconcile("gpus")
    assert (await env.get(six))["status"] == "queued"


async def test_gang_distinct_nodes_with_too_few_nodes_is_rejected(env: Env) -> None:
    await _one_pool(env)
    await env.node("n1", "gpus", gpus=GPUS8)
    await env.node("n2", "gpus", gpus=GPUS8)
    member = {"subject": "s", "pool": "gpus", "resources": {"gpu": 1}}
    docs = await env.gang([member] * 3, distinct=True)
    assert [(d["status"], d["reason"]) for d in docs] == [("rejected", "no_fitting_node")] * 3


# --- gangs -----------------------------------------------------------------------------------


async def test_gang_members_one_per_node_with_distinct_nodes(env: Env) -> None:
    await _one_pool(env)
    for name in ("n1", "n2", "n3"):
        await env.node(name, "gpus", gpus=GPUS8)
    member = {"subject": "s", "pool": "gpus", "resources": {"gpu": 4}}
    # Without distinct_nodes, pack puts both on one node.
    packed = await env.gang([member | {"resources": {"gpu": 2}}] * 2, distinct=False)
    assert [(await env.where(d) or ("?",))[0] for d in packed] == ["n1", "n1"]
    spread = await env.gang([member] * 3, distinct=True)
    nodes = [(await env.where(d) or ("?",))[0] for d in spread]
    assert sorted(nodes) == ["n1", "n2", "n3"]
    # GET ?gang_id= shows each member's placement (one per node).
    listed = await env.conn.fetch(
        "SELECT respool.get_request(id) AS doc FROM respool.requests WHERE gang_id = $1",
        spread[0]["gang_id"],
    )
    assert sorted(r["doc"]["placement"]["node"] for r in listed) == ["n1", "n2", "n3"]


async def test_gang_is_placed_all_or_none(env: Env) -> None:
    await _one_pool(env)
    await env.node("n1", "gpus", gpus=GPUS8)
    await env.node("n2", "gpus", gpus=GPUS8)
    blocker = await env.req("s", "gpus", {"gpu": 5}, selector={"node": "n2"})
    member = {"subject": "s", "pool": "gpus", "resources": {"gpu": 4}}
    # n1 has room for one member, n2 (3 free) for none: nobody is placed.
    gang = await env.gang([member] * 2, distinct=True)
    assert [d["status"] for d in gang] == ["queued", "queued"]
    assert all(d["placement"] is None for d in gang)
    assert await env.node_used("n1") == {}
    await env.reconcile("gpus")
    assert [(await env.get(d))["status"] for d in gang] == ["queued", "queued"]
    await env.release(blocker)
    places = [await env.where(d) for d in gang]
    assert sorted(p[0] for p in places if p) == ["n1", "n2"]


# --- preemption on nodes ---------------------------------------------------------------------


async def _reclaim_pool(env: Env, grace: int = 0) -> None:
    """Three 4-gpu nodes; ``a`` owns 4 gpus of share; ``b`` (priority 1) and ``c`` (priority 2)
    own none and borrow."""
    await env.pool("gpus", grace=grace)
    for name in ("n1", "n2", "n3"):
        await env.node(name, "gpus", gpus=["0", "1", "2", "3"])
    await env.policy("a", "gpus", priority=0, reserved={"gpu": 4})
    await env.policy("b", "gpus", priority=1)
    await env.policy("c", "gpus", priority=2)


async def test_reclaim_preempts_only_on_the_node_with_fewest_victims(env: Env) -> None:
    await _reclaim_pool(env)
    # n1: two victims needed (2 + 2); n2: one (4); n3: three (2 + 1 + 1).
    n1 = [await env.req("b", "gpus", {"gpu": 2}, selector={"node": "n1"}) for _ in range(2)]
    n2 = [await env.req("c", "gpus", {"gpu": 4}, selector={"node": "n2"})]
    n3 = [await env.req("b", "gpus", {"gpu": g}, selector={"node": "n3"}) for g in (2, 1, 1)]
    r = await env.req("a", "gpus", {"gpu": 4})
    assert r["status"] == "queued"
    await env.reconcile("gpus")
    assert await env.where(r) == ("n2", ["0", "1", "2", "3"])
    assert [(await env.get(d))["status"] for d in n2] == ["preempted"]
    assert [(await env.get(d))["status"] for d in n1 + n3] == ["allocated"] * 5


async def test_reclaim_tie_on_count_goes_to_the_lowest_top_victim_priority(env: Env) -> None:
    await _reclaim_pool(env)
    hi = await env.req("c", "gpus", {"gpu": 4}, selector={"node": "n1"})  # priority 2
    lo = await env.req("b", "gpus", {"gpu": 4}, selector={"node": "n2"})  # priority 1
    mid = [await env.req("b", "gpus", {"gpu": 2}, selector={"node": "n3"}) for _ in range(2)]
    r = await env.req("a", "gpus", {"gpu": 4})
    await env.reconcile("gpus")
    assert (await env.where(r) or ("?",))[0] == "n2"
    assert [(await env.get(d))["status"] for d in (hi, lo, *mid)] == [
        "allocated",
        "preempted",
        "allocated",
        "allocated",
    ]


async def test_reclaim_full_tie_goes_to_the_node_name(env: Env) -> None:
    await _reclaim_pool(env)
    on = {}
    for name in ("n3", "n2", "n1"):  # allocation order must not decide
        on[name] = await env.req("b", "gpus", {"gpu": 4}, selector={"node": name})
    r = await env.req("a", "gpus", {"gpu": 4})
    await env.reconcile("gpus")
    assert (await env.where(r) or ("?",))[0] == "n1"
    assert [(await env.get(on[n]))["status"] for n in ("n1", "n2", "n3")] == [
        "preempted",
        "allocated",
        "allocated",
    ]


async def test_grace_period_earmark_holds_the_node_and_its_devices(env: Env) -> None:
    await _reclaim_pool(env, grace=60)
    victims = {}
    for name in ("n1", "n2", "n3"):
        victims[name] = await env.req("b", "gpus", {"gpu": 4}, selector={"node": name})
    r = await env.req("a", "gpus", {"gpu": 4})
    await env.reconcile("gpus")
    v = await env.get(victims["n1"])
    assert v["status"] == "preempting"
    assert v["placement"]["node"] == "n1"  # still holds its devices in its grace period
    assert (await env.get(r))["status"] == "queued"
    # A third request arrives before the victim leaves; after it leaves the devices go to r.
    third = await env.req("c", "gpus", {"gpu": 1})
    assert third["status"] == "queued"
    await env.release(victims["n1"])
    assert await env.where(r) == ("n1", ["0", "1", "2", "3"])
    assert (await env.get(third))["status"] == "queued"
    assert [(await env.get(victims[n]))["status"] for n in ("n2", "n3")] == ["allocated"] * 2


async def test_node_shrink_preempts_the_minimal_set_on_that_node_only(env: Env) -> None:
    await env.pool("cpus")
    await env.policy("s", "cpus")
    await env.node("n1", "cpus", capacity={"mcpu": 4000})
    await env.node("n2", "cpus", capacity={"mcpu": 4000})
    on1 = [
        await env.req("s", "cpus", {"mcpu": m}, selector={"node": "n1"}) for m in (1000, 1000, 2000)
    ]
    on2 = await env.req("s", "cpus", {"mcpu": 3000}, selector={"node": "n2"})
    await env.update_node("n1", {"capacity": {"mcpu": 2000}})
    await env.reconcile("cpus")
    # Victim order: most recently allocated first; 2000 over: the 2000 alone is enough.
    assert [(await env.get(d))["status"] for d in on1] == ["allocated", "allocated", "preempted"]
    assert (await env.get(on1[2]))["reason"] == "capacity_shrink"
    assert (await env.get(on2))["status"] == "allocated"
    assert await env.node_used("n1") == {"mcpu": 2000}
    assert await env.node_used("n2") == {"mcpu": 3000}


async def test_a_pool_without_nodes_places_nothing(env: Env) -> None:
    await env.conn.fetchval(
        "SELECT respool.create_pool(p_name => 'flat', p_capacity => '{\"gpu\": 4}')"
    )
    await env.policy("s", "flat")
    a = await env.req("s", "flat", {"gpu": 2})
    assert a["status"] == "allocated"
    assert a["placement"] is None
    assert (await env.get(a))["placement"] is None
    assert await env.conn.fetchval("SELECT count(*) FROM respool.placements") == 0


# --- concurrency -----------------------------------------------------------------------------

# The node invariants (docs/placement.md), each row starting with its name: I4 (node counters
# equal the units their placements charge), I5 (per node and key, placed units <= capacity), I6
# (a device held by one allocation only: each placement holds exactly as many devices of a named
# key as it was charged, and a held device's holder is placed on that node), I7 (every holding
# request of a pool with nodes is placed on a node of that pool, and only holding requests are).
NODE_INVARIANTS_SQL = """
SELECT 'I4 node counter ' || n.name || '/' || nr.key || ': used ' || nr.used || ' <> placed '
       || coalesce(s.placed, 0)
  FROM respool.node_resources nr JOIN respool.nodes n ON n.id = nr.node_id
  LEFT JOIN (SELECT pl.node_id, x.key, sum(x.value::bigint) AS placed
               FROM respool.placements pl CROSS JOIN LATERAL jsonb_each_text(pl.resources) x
              GROUP BY 1, 2) s ON s.node_id = nr.node_id AND s.key = nr.key
 WHERE nr.used <> coalesce(s.placed, 0)
UNION ALL
SELECT 'I5 node ' || n.name || '/' || nr.key || ': placed ' || s.placed || ' > capacity '
       || nr.capacity
  FROM respool.node_resources nr JOIN respool.nodes n ON n.id = nr.node_id
  JOIN (SELECT pl.node_id, x.key, sum(x.value::bigint) AS placed
          FROM respool.placements pl CROSS JOIN LATERAL jsonb_each_text(pl.resources) x
         GROUP BY 1, 2) s ON s.node_id = nr.node_id AND s.key = nr.key
 WHERE s.placed > nr.capacity
UNION ALL
SELECT 'I6 devices of ' || pl.request_id || ' ' || x.key || ': holds ' || count(d.device)
       || ' <> placed ' || x.value
  FROM respool.placements pl CROSS JOIN LATERAL jsonb_each_text(pl.resources) x
  JOIN respool.node_resources nr ON nr.node_id = pl.node_id AND nr.key = x.key AND nr.devices > 0
  LEFT JOIN respool.node_devices d
         ON d.node_id = pl.node_id AND d.key = x.key AND d.holder_id = pl.request_id
 GROUP BY pl.request_id, x.key, x.value
HAVING count(d.device) <> x.value::bigint
UNION ALL
SELECT 'I6 device ' || d.key || ' ' || d.device || ' held by a request not placed there'
  FROM respool.node_devices d
 WHERE d.holder_id IS NOT NULL
   AND NOT EXISTS (SELECT FROM respool.placements pl
                    WHERE pl.request_id = d.holder_id AND pl.node_id = d.node_id)
UNION ALL
SELECT 'I7 placement of a request not holding in the node''s pool: ' || pl.request_id
  FROM respool.placements pl JOIN respool.nodes n ON n.id = pl.node_id
  JOIN respool.requests r ON r.id = pl.request_id
 WHERE r.status NOT IN ('allocated', 'preempting') OR r.pool_id IS DISTINCT FROM n.pool_id
UNION ALL
SELECT 'I7 holding request not placed: ' || r.id
  FROM respool.requests r
 WHERE r.status IN ('allocated', 'preempting')
   AND EXISTS (SELECT FROM respool.nodes n WHERE n.pool_id = r.pool_id)
   AND NOT EXISTS (SELECT FROM respool.placements pl WHERE pl.request_id = r.id)
"""


@pytest.mark.parametrize("workers", [2, 8])
async def test_concurrent_creates_and_releases_never_share_a_device(
    db_url: str, env: Env, workers: int
) -> None:
    await _one_pool(env)
    await env.policy("t", "gpus")
    await env.node("n1", "gpus", gpus=["0", "1", "2", "3"], capacity={"mcpu": 8000})
    await env.node("n2", "gpus", gpus=["a", "b", "c"])
    await env.node("n3", "gpus", capacity={"mcpu": 4000})
    seen: list[str] = []

    def body(rng: random.Random) -> dict[str, Any]:
        resources = {"gpu": rng.randint(1, 3)} if rng.random() < 0.8 else {}
        if rng.random() < 0.4:
            resources["mcpu"] = rng.choice([500, 2000])
        doc: dict[str, Any] = {"subject": rng.choice(["s", "t"]), "pool": "gpus"}
        doc["resources"] = resources
        if rng.random() < 0.2:
            doc["node_selector"] = {"node": rng.choice(["n1", "n2"])}
        return doc

    async def after(_: asyncpg.Connection, doc: dict[str, Any]) -> None:
        # Every document a worker sees shows only devices of its own node.
        if doc["placement"]:
            seen.append(doc["placement"]["node"])

    async def worker(seed: int) -> None:
        await churn(db_url, seed, body, after, cancel_at_end=True)

    async def auditor(stop: asyncio.Event) -> list[str]:
        c = await connect(db_url, application_name=APP_CLI)
        found: list[str] = []
        try:
            while not stop.is_set():
                async with c.transaction(isolation="repeatable_read", readonly=True):
                    found += [r[0] for r in await c.fetch(NODE_INVARIANTS_SQL)]
                await asyncio.sleep(0)
        finally:
            await c.close()
        return found

    stop = asyncio.Event()
    audit = asyncio.create_task(auditor(stop))
    await asyncio.gather(*(worker(seed) for seed in range(workers)))
    stop.set()
    assert await audit == []
    assert [r[0] for r in await env.conn.fetch(NODE_INVARIANTS_SQL)] == []
    assert seen  # grants did happen
    # Every worker cancelled what it still had: nothing is left on any node.
    assert await env.conn.fetchval("SELECT coalesce(sum(used), 0) FROM respool.node_resources") == 0
    assert (
        await env.conn.fetchval(
            "SELECT count(*) FROM respool.node_devices WHERE holder_id IS NOT NULL"
        )
        == 0
    )
