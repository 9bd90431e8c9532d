"""Nodes in SQL (docs/placement.md): their fields and validations, the derived capacity of a
pool with nodes, the reserved-share check when a node leaves, cordon / drain / uncordon,
removing a node or a device while it is held, and two nodes joining one pool at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from engine_support import assert_healthy, events, get, mk_policy, mk_pool, mk_req, reconcile

from app.db import batch as db_batch
from app.db import nodes as db_nodes
from app.db import pools as db_pools
from app.db.errors import BadInput, Conflict, NotFound
from support.db import direct
from support.wait import wait_until


async def node_pool(conn: asyncpg.Connection, name: str = "gpus", **kw: Any) -> None:
    """A pool meant for nodes (created without capacity) and a plain policy for subject S."""
    await mk_pool(conn, name, {}, **kw)
    await mk_policy(conn, "S", name)


async def node_a(conn: asyncpg.Connection, **body: Any) -> None:
    """A node pool gpus (:func:`node_pool`) with one node a in it (``body``: its devices or
    capacity)."""
    await node_pool(conn)
    await db_nodes.create_node(conn, {"name": "a", "pool": "gpus", **body})


async def capacity(conn: asyncpg.Connection, pool: str = "gpus") -> dict[str, int]:
    return (await db_pools.get_pool(conn, pool)).capacity


async def eight_gpus(
    conn: asyncpg.Connection, name: str, pool: str | None = "gpus", **kw: Any
) -> None:
    body: dict[str, Any] = {
        "name": name,
        "pool": pool,
        "devices": {"gpu": [str(i) for i in range(8)]},
    }
    await db_nodes.create_node(conn, body | kw)


# --- fields ------------------------------------------------------------------------------------


async def test_create_read_list_update_delete(conn: asyncpg.Connection) -> None:
    await node_pool(conn)
    made = await db_nodes.create_node(
        conn,
        {
            "name": "gpu-host-1",
            "pool": "gpus",
            "labels": {"gpu-type": "A100-80G", "zone": "eu-1"},
            "capacity": {"mcpu": 64000, "memory_mb": 512000},
            "devices": {"gpu": ["GPU-aaa", "GPU-bbb", "2", "3"]},
        },
    )
    assert made.name == "gpu-host-1" and made.pool == "gpus" and made.state == "active"
    assert made.capacity == {"gpu": 4, "mcpu": 64000, "memory_mb": 512000}
    assert made.devices == {"gpu": ["GPU-aaa", "GPU-bbb", "2", "3"]}  # list order kept
    assert made.labels == {"gpu-type": "A100-80G", "zone": "eu-1"}
    assert made.usage == {"gpu": 0, "mcpu": 0, "memory_mb": 0} and made.allocations == []
    assert await db_nodes.get_node(conn, "gpu-host-1") == made

    await db_nodes.create_node(conn, {"name": "spare"})  # registered, in no pool
    assert [n.name for n in await db_nodes.list_nodes(conn)] == ["gpu-host-1", "spare"]
    assert [n.name for n in await db_nodes.list_nodes(conn, pool="gpus")] == ["gpu-host-1"]
    assert (await db_nodes.get_node(conn, "spare")).pool is None

    changed = await db_nodes.update_node(
        conn,
        "gpu-host-1",
        {"labels": {"zone": None, "rack": "r7"}, "capacity": {"memory_mb": 0, "tpu": 2}},
    )
    assert changed.labels == {"gpu-type": "A100-80G", "rack": "r7"}
    assert changed.capacity == {"gpu": 4, "mcpu": 64000, "tpu": 2}
    assert changed.updated_at >= made.updated_at and changed.created_at == made.created_at
    assert await capacity(conn) == {"gpu": 4, "mcpu": 64000, "tpu": 2}

    await db_nodes.delete_node(conn, "gpu-host-1")
    with pytest.raises(NotFound) as e:
        await db_nodes.get_node(conn, "gpu-host-1")
    assert e.value.field == "name"
    assert await capacity(conn) == {}
    assert (await db_pools.get_pool(conn, "gpus")).nodes == 0


async def test_selector_matches_every_pair_and_the_builtin_node_label(
    conn: asyncpg.Connection,
) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a1", labels={"gpu-type": "A100", "zone": "x"})
    await eight_gpus(conn, "a2", labels={"gpu-type": "A100", "zone": "y"})
    await eight_gpus(conn, "h1", labels={"gpu-type": "H100", "zone": "x"})

    async def names(selector: dict[str, str], pool: str | None = None) -> list[str]:
        return [n.name for n in await db_nodes.list_nodes(conn, pool=pool, selector=selector)]

    assert await names({"gpu-type": "A100"}) == ["a1", "a2"]
    assert await names({"gpu-type": "A100", "zone": "x"}) == ["a1"]
    assert await names({"node": "h1"}) == ["h1"]
    assert await names({"node": "h1", "gpu-type": "A100"}) == []
    assert await names({"missing": ""}) == []
    assert await names({}, pool="gpus") == ["a1", "a2", "h1"]
    with pytest.raises(NotFound):
        await names({}, pool="nope")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "Big"}, "name"),
        ({"name": "-x"}, "name"),
        ({"name": "a" * 64}, "name"),
        ({}, "name"),
        ({"name": "n", "colour": "red"}, "colour"),
        ({"name": "n", "labels": {"Bad Key": "x"}}, "labels.Bad Key"),
        ({"name": "n", "labels": {"node": "other"}}, "labels.node"),
        ({"name": "n", "labels": {"k": "v" * 64}}, "labels.k"),
        ({"name": "n", "labels": {"k": "tab\there"}}, "labels.k"),
        ({"name": "n", "labels": {"k": 1}}, "labels.k"),
        ({"name": "n", "labels": ["k"]}, "labels"),
        ({"name": "n", "capacity": {"gpu": -1}}, "capacity.gpu"),
        ({"name": "n", "capacity": {"gpu": 1.5}}, "capacity.gpu"),
        ({"name": "n", "capacity": {"GPU": 1}}, "capacity.GPU"),
        ({"name": "n", "devices": {"GPU": ["0"]}}, "devices.GPU"),
        ({"name": "n", "devices": {"gpu": []}}, "devices.gpu"),
        ({"name": "n", "devices": {"gpu": ["0", "0"]}}, "devices.gpu"),
        ({"name": "n", "devices": {"gpu": [""]}}, "devices.gpu"),
        ({"name": "n", "devices": {"gpu": ["x" * 129]}}, "devices.gpu"),
        ({"name": "n", "devices": {"gpu": [0, 1]}}, "devices.gpu"),
        ({"name": "n", "devices": {"gpu": ["0", "1"]}, "capacity": {"gpu": 4}}, "devices.gpu"),
        ({"name": "n", "state": "broken"}, "state"),
        ({"name": "n", "pool": "nope"}, "pool"),
        ({"name": "n", "pool": 7}, "pool"),
    ],
)
async def test_bad_node_names_its_field_and_changes_nothing(
    conn: asyncpg.Connection, body: dict[str, Any], field: str
) -> None:
    await node_pool(conn)
    with pytest.raises((BadInput, NotFound)) as e:
        await db_nodes.create_node(conn, body)
    assert e.value.field == field
    assert await db_nodes.list_nodes(conn) == []
    assert await capacity(conn) == {}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"labels": {"node": "x"}}, "labels.node"),
        ({"capacity": {"gpu": 4}}, "devices.gpu"),  # 8 ids listed: give the new list too
        ({"devices": {"gpu": ["0"]}, "capacity": {"gpu": 2}}, "devices.gpu"),
        ({"devices": {"gpu": []}}, "devices.gpu"),
        ({"state": "asleep"}, "state"),
        ({"pool": "nope"}, "pool"),
        ({"name": "renamed"}, "name"),
    ],
)
async def test_bad_update_names_its_field_and_changes_nothing(
    conn: asyncpg.Connection, body: dict[str, Any], field: str
) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "n1", labels={"a": "b"})
    before = await db_nodes.get_node(conn, "n1")
    with pytest.raises((BadInput, NotFound)) as e:
        await db_nodes.update_node(conn, "n1", body)
    assert e.value.field == field
    assert await db_nodes.get_node(conn, "n1") == before
    assert await capacity(conn) == {"gpu": 8}


async def test_unknown_node_is_404(conn: asyncpg.Connection) -> None:
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: db_nodes.get_node(conn, "ghost"),
        lambda: db_nodes.update_node(conn, "ghost", {"labels": {"a": "b"}}),
        lambda: db_nodes.delete_node(conn, "ghost"),
        lambda: db_nodes.set_node_state(conn, "ghost", "cordoned"),
    ]
    for call in calls:
        with pytest.raises(NotFound) as e:
            await call()
        assert "ghost" in str(e.value)


async def test_name_is_unique_across_pools(conn: asyncpg.Connection) -> None:
    await node_pool(conn, "a")
    await node_pool(conn, "b")
    await eight_gpus(conn, "n1", pool="a")
    with pytest.raises(Conflict) as e:
        await eight_gpus(conn, "n1", pool="b")
    assert e.value.field == "name" and "n1" in str(e.value)
    assert await capacity(conn, "b") == {}


async def test_devices_decide_capacity_and_anonymous_units_stay_possible(
    conn: asyncpg.Connection,
) -> None:
    await node_pool(conn)
    n = await db_nodes.create_node(
        conn,
        {
            "name": "n",
            "pool": "gpus",
            "devices": {"gpu": ["0", "1"]},
            "capacity": {"gpu": 2, "tpu": 3},
        },
    )
    assert n.capacity == {"gpu": 2, "tpu": 3} and n.devices == {"gpu": ["0", "1"]}
    n = await db_nodes.update_node(conn, "n", {"devices": {"gpu": ["1", "0", "7"]}})
    assert n.capacity["gpu"] == 3 and n.devices == {"gpu": ["1", "0", "7"]}
    n = await db_nodes.update_node(conn, "n", {"devices": {"gpu": None}})  # anonymous units
    assert n.capacity["gpu"] == 3 and n.devices == {}
    n = await db_nodes.update_node(conn, "n", {"capacity": {"gpu": 5}})
    assert n.capacity["gpu"] == 5
    n = await db_nodes.update_node(conn, "n", {"capacity": {"gpu": 0}})
    assert n.capacity == {"tpu": 3}
    assert await capacity(conn) == {"tpu": 3}


# --- the pool's capacity ----------------------------------------------------------------------


async def test_pool_capacity_is_the_sum_over_its_nodes_in_any_state(
    conn: asyncpg.Connection,
) -> None:
    await node_pool(conn)
    assert await capacity(conn) == {}  # capacity 0 until a node joins
    await eight_gpus(conn, "a", capacity={"mcpu": 32000})
    await eight_gpus(conn, "b", capacity={"mcpu": 16000})
    pool = await db_pools.get_pool(conn, "gpus")
    assert pool.capacity == {"gpu": 16, "mcpu": 48000} and pool.nodes == 2
    await db_nodes.set_node_state(conn, "a", "cordoned")
    await db_nodes.set_node_state(conn, "b", "draining")
    assert await capacity(conn) == {"gpu": 16, "mcpu": 48000}
    await db_nodes.update_node(conn, "a", {"pool": None})  # leaves: registered, in no pool
    assert await capacity(conn) == {"gpu": 8, "mcpu": 16000}
    await db_nodes.update_node(conn, "a", {"pool": "gpus"})
    assert await capacity(conn) == {"gpu": 16, "mcpu": 48000}
    # A soft key some node does not list is unbounded there, so the pool does not bound it.
    await eight_gpus(conn, "c")
    assert await capacity(conn) == {"gpu": 24}
    await db_nodes.delete_node(conn, "c")
    await db_nodes.delete_node(conn, "a")
    await db_nodes.delete_node(conn, "b")
    assert await capacity(conn) == {}
    await assert_healthy(conn)


async def test_pool_with_nodes_refuses_a_capacity_and_keeps_its_other_settings(
    conn: asyncpg.Connection,
) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a")
    with pytest.raises(Conflict) as e:
        await db_pools.update_pool(conn, "gpus", capacity={"gpu": 4})
    assert e.value.field == "capacity" and "backed by nodes" in str(e.value)
    assert await capacity(conn) == {"gpu": 8}
    pool = await db_pools.update_pool(conn, "gpus", placement="spread", description="d")
    assert pool.placement == "spread" and pool.description == "d" and pool.capacity == {"gpu": 8}
    with pytest.raises(BadInput) as e2:
        await db_pools.update_pool(conn, "gpus", placement="scatter")
    assert e2.value.field == "placement"
    made = await db_pools.create_pool(conn, name="other", placement="spread")
    assert made.placement == "spread" and made.nodes == 0


async def test_node_cannot_join_a_pool_with_a_hand_set_capacity(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "abstract", {"gpu": 4})
    with pytest.raises(Conflict) as e:
        await eight_gpus(conn, "a", pool="abstract")
    assert e.value.field == "pool" and "capacity" in str(e.value)
    assert await db_nodes.list_nodes(conn) == []
    await db_pools.update_pool(conn, "abstract", capacity={"gpu": 0})  # the fix the message names
    await eight_gpus(conn, "a", pool="abstract")
    assert await capacity(conn, "abstract") == {"gpu": 8}


async def test_reserved_shares_must_still_fit_when_a_node_leaves(conn: asyncpg.Connection) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a")
    await eight_gpus(conn, "b")
    await mk_policy(conn, "team-x", "gpus", reserved={"gpu": 12})
    leaves: list[Callable[[], Awaitable[object]]] = [
        lambda: db_nodes.delete_node(conn, "b"),
        lambda: db_nodes.update_node(conn, "b", {"pool": None}),
        lambda: db_nodes.update_node(conn, "b", {"devices": {"gpu": ["0", "1"]}}),
    ]
    for leave in leaves:
        with pytest.raises(Conflict) as e:
            await leave()
        assert "team-x reserves 12" in str(e.value)
    assert await capacity(conn) == {"gpu": 16}
    assert [n.name for n in await db_nodes.list_nodes(conn, pool="gpus")] == ["a", "b"]


async def test_two_nodes_join_one_pool_at_once(conn: asyncpg.Connection, db_url: str) -> None:
    await node_pool(conn)
    async with direct(db_url) as other:
        tx = conn.transaction()
        await tx.start()
        await eight_gpus(conn, "a")  # holds the pool row until commit
        second = asyncio.ensure_future(
            db_nodes.create_node(other, {"name": "b", "pool": "gpus", "capacity": {"gpu": 8}})
        )
        other_pid = other.get_server_pid()

        async def second_waits_for_the_pool() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", other_pid
                )
            )

        await wait_until(second_waits_for_the_pool, "the second join to wait for the pool lock")
        await tx.commit()
        await second
    assert await capacity(conn) == {"gpu": 16}


# --- states -------------------------------------------------------------------------------------


async def test_cordon_drain_uncordon(conn: asyncpg.Connection) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a")
    assert (await db_nodes.set_node_state(conn, "a", "cordoned")).state == "cordoned"
    assert (await db_nodes.set_node_state(conn, "a", "draining")).state == "draining"
    assert (await db_nodes.set_node_state(conn, "a", "active")).state == "active"
    assert (await db_nodes.update_node(conn, "a", {"state": "cordoned"})).state == "cordoned"
    with pytest.raises(BadInput) as e:
        await db_nodes.set_node_state(conn, "a", "gone")  # type: ignore[arg-type]
    assert e.value.field == "state"


# --- holders (the engine places requests on nodes) ----------------------------------------------


async def test_a_grant_is_placed_on_a_node_and_shown_there(conn: asyncpg.Connection) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a")
    r = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    assert r.status == "allocated"
    node = await db_nodes.get_node(conn, "a")
    assert node.usage["gpu"] == 2
    [held] = node.allocations
    assert (held.request_id, held.subject, held.status) == (r.id, "S", "allocated")
    assert held.resources == {"gpu": 2} and held.devices == {"gpu": ["0", "1"]}


async def test_removing_a_held_node_is_refused_unless_forced(conn: asyncpg.Connection) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a")
    r = await mk_req(conn, "S", "gpus", resources={"gpu": 4})
    assert r.status == "allocated"
    removes: list[Callable[[], Awaitable[object]]] = [
        lambda: db_nodes.delete_node(conn, "a"),
        lambda: db_nodes.update_node(conn, "a", {"pool": None}),
    ]
    for remove in removes:
        with pytest.raises(Conflict) as e:
            await remove()
        assert e.value.field == "force" and "1 allocation" in str(e.value)
    assert (await get(conn, r.id)).status == "allocated"

    await db_nodes.delete_node(conn, "a", force=True)
    gone = await get(conn, r.id)
    assert (gone.status, gone.reason) == ("preempted", "node_removed")
    assert "node a" in gone.message
    assert await capacity(conn) == {}
    await assert_healthy(conn)


async def test_forced_move_preempts_at_once_without_grace(conn: asyncpg.Connection) -> None:
    await node_pool(conn, preemption_grace_seconds=600)
    await node_pool(conn, "elsewhere")
    await eight_gpus(conn, "a")
    r = await mk_req(conn, "S", "gpus", resources={"gpu": 1})
    moved = await db_nodes.update_node(conn, "a", {"pool": "elsewhere"}, force=True)
    assert moved.pool == "elsewhere" and moved.allocations == [] and moved.usage["gpu"] == 0
    assert [e[1:] for e in await events(conn, r.id)][-1] == ("preempted", "node_removed")
    assert await capacity(conn) == {} and await capacity(conn, "elsewhere") == {"gpu": 8}
    await assert_healthy(conn)


async def test_removed_device_preempts_its_holder_and_kept_ones_stay(
    conn: asyncpg.Connection,
) -> None:
    await node_a(conn, devices={"gpu": ["0", "1", "2", "3"]})
    first = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    second = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    node = await db_nodes.get_node(conn, "a")
    held = {a.request_id: a.devices["gpu"] for a in node.allocations}
    assert held == {first.id: ["0", "1"], second.id: ["2", "3"]}

    node = await db_nodes.update_node(conn, "a", {"devices": {"gpu": ["3", "2", "0"]}})
    assert node.devices == {"gpu": ["3", "2", "0"]} and node.capacity == {"gpu": 3}
    assert [a.request_id for a in node.allocations] == [second.id]
    assert node.allocations[0].devices == {"gpu": ["3", "2"]}  # kept, in the new list order
    lost = await get(conn, first.id)
    assert (lost.status, lost.reason) == ("preempted", "capacity_shrink")
    assert "device gpu 1" in lost.message
    assert (await get(conn, second.id)).status == "allocated"
    await assert_healthy(conn)


async def test_uncordon_grants_what_waited(conn: asyncpg.Connection) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a", state="cordoned")
    r = await mk_req(conn, "S", "gpus", resources={"gpu": 1})
    assert r.status == "queued"  # a cordoned node takes no new grants
    await db_nodes.set_node_state(conn, "a", "active")
    assert (await get(conn, r.id)).status == "allocated"


async def test_growth_grants_what_now_fits(conn: asyncpg.Connection) -> None:
    await node_a(conn, devices={"gpu": ["0", "1"]})
    held = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    waiting = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    assert (held.status, waiting.status) == ("allocated", "queued")
    await db_nodes.update_node(conn, "a", {"devices": {"gpu": ["0", "1", "2", "3"]}})
    assert (await get(conn, waiting.id)).status == "allocated"
    await assert_healthy(conn)


async def test_drain_lets_the_reconciler_preempt_preemptible_holders(
    conn: asyncpg.Connection,
) -> None:
    await mk_pool(conn, "gpus", {})
    await mk_policy(conn, "S", "gpus", reserved={"gpu": 0})
    await eight_gpus(conn, "a")
    await mk_policy(conn, "NP", "gpus", reserved={"gpu": 1})
    soft = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    firm = await mk_req(conn, "NP", "gpus", resources={"gpu": 1}, preemptible=False)
    drained = await db_nodes.set_node_state(conn, "a", "draining")
    assert drained.state == "draining" and len(drained.allocations) == 2  # nothing at once
    await reconcile(conn, "gpus")
    lost = await get(conn, soft.id)
    assert (lost.status, lost.reason) == ("preempted", "node_drain")
    assert (await get(conn, firm.id)).status == "allocated"  # finishes on its own
    await assert_healthy(conn)


async def test_anonymous_shrink_is_left_to_the_reconciler(conn: asyncpg.Connection) -> None:
    await node_a(conn, capacity={"gpu": 8})
    big = await mk_req(conn, "S", "gpus", resources={"gpu": 4})
    small = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    node = await db_nodes.update_node(conn, "a", {"capacity": {"gpu": 4}})
    assert node.capacity == {"gpu": 4} and node.usage == {"gpu": 6}  # nobody preempted yet
    assert await capacity(conn) == {"gpu": 4}
    await reconcile(conn, "gpus")
    assert [r.status for r in (await get(conn, big.id), await get(conn, small.id))] == [
        "allocated",
        "preempted",
    ]  # the minimal set: the 2-GPU holder is enough
    assert (await db_nodes.get_node(conn, "a")).usage == {"gpu": 4}
    await assert_healthy(conn)


async def test_removed_key_preempts_its_holders_and_a_soft_key_only_stops_counting(
    conn: asyncpg.Connection,
) -> None:
    await node_a(conn, capacity={"gpu": 4, "tpu": 2, "mcpu": 8000})
    tpu = await mk_req(conn, "S", "gpus", resources={"tpu": 1, "mcpu": 1000})
    gpu = await mk_req(conn, "S", "gpus", resources={"gpu": 1, "mcpu": 1000})
    node = await db_nodes.update_node(conn, "a", {"capacity": {"tpu": 0, "mcpu": 0}})
    assert node.capacity == {"gpu": 4} and node.usage == {"gpu": 1}
    lost = await get(conn, tpu.id)
    assert (lost.status, lost.reason) == ("preempted", "capacity_shrink")
    assert "tpu" in lost.message
    assert (await get(conn, gpu.id)).status == "allocated"  # mcpu is untracked now, not gone
    assert [a.resources for a in node.allocations] == [{"gpu": 1}]
    node = await db_nodes.update_node(conn, "a", {"capacity": {"mcpu": 4000}})
    assert node.usage == {"gpu": 1, "mcpu": 1000}  # tracked again: its holder is charged
    await assert_healthy(conn)


async def test_naming_devices_gives_holders_the_first_ids(conn: asyncpg.Connection) -> None:
    await node_a(conn, capacity={"gpu": 4})
    r = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    node = await db_nodes.update_node(conn, "a", {"devices": {"gpu": ["a", "b", "c", "d"]}})
    assert node.allocations[0].devices == {"gpu": ["a", "b"]}
    nxt = await mk_req(conn, "S", "gpus", resources={"gpu": 2})
    assert nxt.placement is not None and nxt.placement.devices == {"gpu": ["c", "d"]}
    assert (await get(conn, r.id)).status == "allocated"
    await assert_healthy(conn)


async def test_queued_request_that_no_node_can_hold_any_more_is_rejected(
    conn: asyncpg.Connection,
) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a", state="cordoned", labels={"gpu-type": "H100"})
    await eight_gpus(conn, "b")
    r = await mk_req(conn, "S", "gpus", resources={"gpu": 1}, node_selector={"gpu-type": "H100"})
    assert r.status == "queued"  # its only node is cordoned: it waits
    await db_nodes.delete_node(conn, "a")
    gone = await get(conn, r.id)
    assert (gone.status, gone.reason) == ("rejected", "no_fitting_node")


async def test_forced_removal_takes_the_whole_gang(conn: asyncpg.Connection) -> None:
    await node_pool(conn)
    await eight_gpus(conn, "a")
    await eight_gpus(conn, "b")
    made = await db_batch.create_requests(
        conn,
        [{"subject": "S", "pool": "gpus", "resources": {"gpu": 4}} for _ in range(2)],
        all_or_nothing=True,
        distinct_nodes=True,
    )
    members = [m.request for m in made]
    assert sorted(m.placement.node for m in members if m.placement) == ["a", "b"]
    await db_nodes.delete_node(conn, "a", force=True)
    assert {(await get(conn, m.id)).status for m in members} == {"preempted"}
    assert (await db_nodes.get_node(conn, "b")).allocations == []
    await assert_healthy(conn)
