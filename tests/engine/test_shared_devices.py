"""Shared devices (docs/placement.md, "Sharing a GPU"), through the SQL functions with an explicit
clock, read back from the request documents, the node and the views.

What a user of a shared GPU checks: two slices share one 80 GB device; a whole request waits while
a slice holds the device (and the reverse); pack and spread pick the device; a slice that fits no
single device is rejected ``no_fitting_node``; a slice key no node shares is the ordinary
capacity-0 rejection; release gives the slice back; whole shared devices count their memory and
share on the pool; a device that goes or shrinks preempts its slices; I8/I9 stay empty while
several real connections grant and release at once.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import asyncpg
import pytest

from support.churn import churn
from support.db import RECONCILE_POOL, ClockedConn
from support.placement import gpu_placement
from support.twins import install_twin

CLOCK0 = ClockedConn.clock0
GB80 = 81920  # MiB of an 80 GB device


class Env(ClockedConn):
    """One connection, a clock one second per call, a pool ``gpus`` with a policy for ``s``."""

    async def pool(self, placement: str = "pack", *subjects: str) -> None:
        await self.conn.fetchval(
            "SELECT respool.create_pool(p_name => 'gpus', p_capacity => '{}', p_placement => $1,"
            " p_now => $2)",
            placement,
            self.now(),
        )
        for subject, priority in [("s", 0), *((x, 5) for x in subjects)]:
            await self.conn.fetchval(
                "SELECT respool.create_policy(p_subject => $1, p_pool => 'gpus',"
                " p_priority => $2, p_now => $3)",
                subject,
                priority,
                self.now(),
            )

    async def node(
        self,
        name: str,
        gpus: list[str],
        *,
        mode: str | None = "mps",
        memory: int = GB80,
        reserved: int = 0,
        capacity: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "pool": "gpus", "devices": {"gpu": gpus}}
        if capacity:
            body["capacity"] = capacity
        if mode is not None:
            body["sharing"] = {"gpu": mode}
            body["device_memory_mb"] = {"gpu": memory}
            body["reserved_memory_mb"] = {"gpu": reserved}
        doc: dict[str, Any] = await self.conn.fetchval(
            "SELECT respool.create_node($1, p_now => $2)", body, self.now()
        )
        return doc

    async def update_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = await self.conn.fetchval(
            "SELECT respool.update_node($1, $2, p_now => $3)", name, body, self.now()
        )
        return doc

    async def req(
        self, resources: dict[str, int], subject: str = "s", **extra: Any
    ) -> dict[str, Any]:
        body = {"subject": subject, "pool": "gpus", "resources": resources, **extra}
        doc: dict[str, Any] = await self.conn.fetchval(
            "SELECT request FROM respool.create_request($1, p_now => $2)", body, self.now()
        )
        return doc

    async def reconcile(self) -> None:
        await self.conn.fetchval(RECONCILE_POOL, "gpus", self.now())

    async def pool_used(self) -> dict[str, int]:
        rows = await self.conn.fetch(
            "SELECT key, allocated FROM respool.pool_usage WHERE pool = 'gpus'"
        )
        return {r["key"]: r["allocated"] for r in rows}

    async def devices(self) -> list[dict[str, Any]]:
        rows = await self.conn.fetch(
            "SELECT node, device, sharing, memory_mb, memory_used, share_used, slices,"
            " whole_holder FROM respool.device_usage WHERE pool = 'gpus'"
        )
        return [dict(r) for r in rows]

    async def violations(self) -> list[dict[str, Any]]:
        rows = await self.conn.fetch("SELECT * FROM respool.invariant_violations")
        return [dict(r) for r in rows]


@pytest.fixture
def env(conn: asyncpg.Connection) -> Env:
    return Env(conn)


def slice_of(doc: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """(device id, its slice) of a granted slice of a gpu."""
    ((device, held),) = doc["placement"]["slices"]["gpu"].items()
    return device, held


async def test_two_slices_share_one_80gb_device(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0"], reserved=512)
    a = await env.req({"gpu_memory_mb": 20480, "gpu_share": 50})
    b = await env.req({"gpu_memory_mb": 40960})
    assert a["status"] == b["status"] == "allocated"
    assert a["placement"] == gpu_placement(
        "n1", ["0"], slices={"0": {"memory_mb": 20480, "share": 50}}, isolation="mps"
    )
    assert slice_of(b) == ("0", {"memory_mb": 40960})  # no share asked: none in the answer
    # the pool counts the device's offer (80 GB less 512 MiB kept back) and 100 of share
    used = await env.pool_used()
    assert used["gpu_memory_mb"] == 61440 and used["gpu_share"] == 50 and used["gpu"] == 0
    (dev,) = await env.devices()
    assert (dev["memory_mb"], dev["memory_used"], dev["share_used"], dev["slices"]) == (
        GB80 - 512, 61440, 50, 2,
    )  # fmt: skip
    # a third slice needs more memory than the device has left: it waits, and says why
    c = await env.req({"gpu_memory_mb": 20480})
    assert c["status"] == "queued"
    assert c["message"] == "waiting for gpu_memory_mb: pool 61440/81408 used, needs 20480"
    await env.release(a)
    assert (await env.get(c))["status"] == "allocated"
    assert await env.violations() == []


async def test_shares_add_up_to_at_most_100_per_device(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"])
    a = await env.req({"gpu_memory_mb": 1000, "gpu_share": 60})
    b = await env.req({"gpu_memory_mb": 1000, "gpu_share": 60})
    assert slice_of(a)[0] != slice_of(b)[0]  # 120 % of one device does not exist
    c = await env.req({"gpu_memory_mb": 1000, "gpu_share": 50})
    assert c["status"] == "queued"
    d = await env.req({"gpu_memory_mb": 1000, "gpu_share": 40})
    assert d["status"] == "allocated"


async def test_a_whole_request_waits_while_a_slice_holds_the_device(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0"])
    piece = await env.req({"gpu_memory_mb": 1024})
    assert piece["status"] == "allocated"
    whole = await env.req({"gpu": 1})
    assert whole["status"] == "queued"
    assert "without a holder or slices" in whole["message"]
    await env.release(piece)
    whole = await env.get(whole)
    assert whole["status"] == "allocated"
    assert whole["placement"]["isolation"] == {"gpu": "exclusive"}
    assert whole["placement"]["slices"] == {}
    # held whole, the device takes no slice, and counts its whole offer on the pool
    small = await env.req({"gpu_memory_mb": 1})
    assert small["status"] == "queued"
    used = await env.pool_used()
    assert (used["gpu"], used["gpu_memory_mb"], used["gpu_share"]) == (1, GB80, 100)
    assert await env.violations() == []
    await env.release(whole)
    assert (await env.get(small))["status"] == "allocated"
    used = await env.pool_used()
    assert (used["gpu"], used["gpu_memory_mb"], used["gpu_share"]) == (0, 1, 0)
    assert await env.violations() == []


async def test_whole_devices_skip_sliced_ones(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1", "2"])
    piece = await env.req({"gpu_memory_mb": 1024})
    assert slice_of(piece)[0] == "0"
    two = await env.req({"gpu": 2})
    assert two["placement"]["devices"] == {"gpu": ["1", "2"]}
    assert (await env.req({"gpu": 1}))["status"] == "queued"


@pytest.mark.parametrize(("placement", "device"), [("pack", "0"), ("spread", "1")])
async def test_pack_takes_the_fullest_device_spread_the_emptiest(
    env: Env, placement: str, device: str
) -> None:
    await env.pool(placement)
    await env.node("n1", ["0", "1"])
    first = await env.req({"gpu_memory_mb": 30000})
    assert slice_of(first)[0] == "0"  # both empty: list order
    second = await env.req({"gpu_memory_mb": 10000})
    assert slice_of(second)[0] == device


async def test_pack_picks_the_device_left_with_least_memory_across_nodes(env: Env) -> None:
    await env.pool()
    await env.node("a", ["0"])
    await env.node("b", ["0"], memory=40960)
    # b's smaller device is left with less memory once the slice is placed
    got = await env.req({"gpu_memory_mb": 20000})
    assert got["placement"]["node"] == "b"


async def test_a_slice_no_device_could_hold_is_rejected(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"], memory=40960, reserved=1024)
    # 60 GB fits the node's sum of offers, but no single device
    big = await env.req({"gpu_memory_mb": 61440})
    assert (big["status"], big["reason"]) == ("rejected", "no_fitting_node")
    assert "fits no single device" in big["message"] and "39936" in big["message"]


async def test_a_slice_key_no_node_shares_is_a_capacity_0_rejection(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0"], mode=None)
    got = await env.req({"gpu_memory_mb": 1024})
    assert got["status"] == "rejected"
    assert got["reason"] in ("pool_missing_key", "exceeds_capacity")


async def test_slices_and_whole_devices_of_one_key_are_refused(env: Env) -> None:
    await env.pool()
    cases = [
        ({"gpu": 1, "gpu_memory_mb": 1024}, "resources.gpu_memory_mb"),
        ({"gpu": 1, "gpu_share": 10}, "resources.gpu_memory_mb"),
        ({"gpu_share": 10}, "resources.gpu_memory_mb"),
        ({"gpu_memory_mb": 1024, "gpu_share": 101}, "resources.gpu_share"),
    ]
    for resources, field in cases:
        with pytest.raises(asyncpg.PostgresError) as caught:
            await env.req(resources)
        assert caught.value.sqlstate == "RP400"
        assert getattr(caught.value, "column_name", None) == field, resources
    assert await env.conn.fetchval("SELECT count(*) FROM respool.requests") == 0


async def test_node_sharing_fields_are_checked(env: Env) -> None:
    await env.pool()
    bad = [
        ({"devices": {"gpu": ["0"]}, "sharing": {"gpu": "nvlink"}}, "sharing.gpu"),
        ({"capacity": {"gpu": 1}, "sharing": {"gpu": "mps"}}, "sharing.gpu"),
        ({"devices": {"gpu": ["0"]}, "sharing": {"gpu": "mps"}}, "device_memory_mb.gpu"),
        ({"devices": {"gpu": ["0"]}, "device_memory_mb": {"gpu": 0}}, "device_memory_mb.gpu"),
        ({"capacity": {"gpu": 1}, "device_memory_mb": {"gpu": 10}}, "device_memory_mb.gpu"),
        (
            {"devices": {"gpu": ["0"]}, "device_memory_mb": {"gpu": 10},
             "reserved_memory_mb": {"gpu": 10}},
            "reserved_memory_mb.gpu",
        ),
        (
            {"devices": {"gpu": ["0"]}, "sharing": {"gpu": "mps"},
             "device_memory_mb": {"gpu": 10}, "capacity": {"gpu_memory_mb": 5}},
            "capacity.gpu_memory_mb",
        ),
    ]  # fmt: skip
    for body, field in bad:
        with pytest.raises(asyncpg.PostgresError) as caught:
            await env.conn.fetchval(
                "SELECT respool.create_node($1)", {"name": "n", "pool": "gpus", **body}
            )
        assert caught.value.sqlstate == "RP400", body
        assert getattr(caught.value, "column_name", None) == field, body
    assert await env.conn.fetchval("SELECT count(*) FROM respool.nodes") == 0


async def test_node_answer_and_pool_capacity(env: Env) -> None:
    await env.pool()
    doc = await env.node("n1", ["0", "1"], mode="time-slicing", reserved=512)
    assert doc["sharing"] == {"gpu": "time-slicing"}
    assert doc["device_memory_mb"] == {"gpu": GB80}
    assert doc["reserved_memory_mb"] == {"gpu": 512}
    assert doc["capacity"] == {"gpu": 2, "gpu_memory_mb": 2 * (GB80 - 512), "gpu_share": 200}
    plain = await env.node("n2", ["0"], mode=None)
    assert (plain["sharing"], plain["device_memory_mb"], plain["reserved_memory_mb"]) == (
        {}, {}, {},
    )  # fmt: skip
    cap = await env.conn.fetchval("SELECT respool.pool_json(respool.resolve_pool('gpus'))")
    assert cap["capacity"] == {"gpu": 3, "gpu_memory_mb": 2 * (GB80 - 512), "gpu_share": 200}
    piece = await env.req({"gpu_memory_mb": 100, "gpu_share": 5})
    assert piece["placement"]["isolation"] == {"gpu": "time-slicing"}
    # an exported node repeats its derived counters: accepted with the derived amount
    again = await env.update_node("n1", {"capacity": doc["capacity"]})
    assert again["capacity"] == doc["capacity"]


async def test_a_device_removed_or_shrunk_preempts_its_slices(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"])
    on0 = await env.req({"gpu_memory_mb": 30000})
    big = await env.req({"gpu_memory_mb": 50000})  # pack: also on 0 (31920 left there)
    on1 = await env.req({"gpu_memory_mb": 50000})
    assert [slice_of(x)[0] for x in (on0, big, on1)] == ["0", "0", "1"]
    # device 1 goes: its slice is preempted at once
    await env.update_node("n1", {"devices": {"gpu": ["0"]}})
    assert (await env.get(on1))["status"] == "preempted"
    # device memory shrinks to 60000: the latest slice goes, the rest fits
    await env.update_node("n1", {"device_memory_mb": {"gpu": 60000}})
    assert [(await env.get(x))["status"] for x in (on0, big)] == ["allocated", "preempted"]
    (dev,) = await env.devices()
    assert (dev["memory_mb"], dev["memory_used"]) == (60000, 30000)
    # sharing goes: slices are preempted, the devices are whole-only again
    await env.update_node("n1", {"sharing": {"gpu": None}})
    assert (await env.get(on0))["status"] == "preempted"
    (dev,) = await env.devices()
    assert dev["sharing"] is None and dev["memory_used"] == 0
    assert await env.violations() == []


async def test_sharing_turned_on_under_a_whole_holder_charges_its_memory(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"], mode=None)
    whole = await env.req({"gpu": 1})
    await env.update_node("n1", {"sharing": {"gpu": "mps"}, "device_memory_mb": {"gpu": GB80}})
    assert (await env.get(whole))["status"] == "allocated"
    used = await env.pool_used()
    assert (used["gpu_memory_mb"], used["gpu_share"]) == (GB80, 100)
    piece = await env.req({"gpu_memory_mb": 1024})
    assert slice_of(piece)[0] == "1"
    assert await env.violations() == []


async def test_device_holders_show_slices(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"])
    a = await env.req({"gpu_memory_mb": 1000, "gpu_share": 10})
    b = await env.req({"gpu_memory_mb": 2000})
    w = await env.req({"gpu": 1})
    rows = await env.conn.fetch(
        "SELECT device, request_id, holds, memory_mb, share FROM respool.device_holders"
        " WHERE node = 'n1'"
    )
    got = sorted(
        (r["device"], str(r["request_id"]), r["holds"], r["memory_mb"], r["share"]) for r in rows
    )
    assert got == sorted([
        ("0", a["id"], "slice", 1000, 10), ("0", b["id"], "slice", 2000, None),
        ("1", w["id"], "whole", None, None),
    ])  # fmt: skip


async def test_reconcile_keeps_slices(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0"])
    a = await env.req({"gpu_memory_mb": 1000})
    await env.reconcile()
    assert (await env.get(a))["status"] == "allocated"
    assert await env.violations() == []


@pytest.mark.parametrize("workers", [4])
async def test_concurrent_slices_and_whole_grants_keep_i8_and_i9(
    db_url: str, env: Env, workers: int
) -> None:
    await env.pool("pack")
    await env.node("n1", ["0", "1"], memory=40000)
    await env.node("n2", ["a", "b", "c"], memory=24000, reserved=1000)

    def body(rng: random.Random) -> dict[str, Any]:
        if rng.random() < 0.3:
            resources = {"gpu": rng.randint(1, 2)}
        else:
            resources = {"gpu_memory_mb": rng.choice([2000, 8000, 15000])}
            if rng.random() < 0.5:
                resources["gpu_share"] = rng.choice([10, 30, 60])
        return {"subject": "s", "pool": "gpus", "resources": resources}

    async def after(c: asyncpg.Connection, _: dict[str, Any]) -> None:
        bad = await c.fetch(
            "SELECT invariant, detail FROM respool.invariant_violations"
            " WHERE invariant IN ('I8', 'I9')"
        )
        assert not bad, bad

    async def worker(seed: int) -> None:
        await churn(db_url, seed, body, after, cancel_at_end=False)

    await asyncio.gather(*(worker(i) for i in range(workers)))
    assert await env.violations() == []


# --- preemption (docs/placement.md, "Sharing a GPU": preemption on one device) -----------------


async def _slices(env: Env, subject: str, *memory: int) -> list[dict[str, Any]]:
    made = [await env.req({"gpu_memory_mb": m}, subject) for m in memory]
    assert all(x["status"] == "allocated" for x in made)
    return made


async def test_priority_preemption_takes_the_smallest_set_on_one_device(env: Env) -> None:
    await env.pool("pack", "t")  # t outranks s
    await env.node("n1", ["0"], memory=80000)
    low = await _slices(env, "s", 40000, 30000)
    high = await env.req({"gpu_memory_mb": 20000}, "t")
    assert high["status"] == "queued"
    await env.reconcile()
    # 10000 MiB were missing: the most recently granted slice of the lower priority goes
    assert [(await env.get(x))["status"] for x in low] == ["allocated", "preempted"]
    assert (await env.get(high))["status"] == "allocated"
    assert await env.violations() == []


async def test_the_device_with_the_fewest_victims_is_chosen(env: Env) -> None:
    await env.pool("pack", "t")
    await env.node("n1", ["0", "1"], memory=80000)
    many = await _slices(env, "s", *([10000] * 8))  # device 0: eight slices
    one = await env.req({"gpu_memory_mb": 80000}, "s")  # device 1: one slice, the whole memory
    assert slice_of(many[0])[0] == "0" and slice_of(one)[0] == "1"
    high = await env.req({"gpu_memory_mb": 40000}, "t")
    await env.reconcile()
    assert (await env.get(high))["status"] == "allocated"
    assert slice_of(await env.get(high))[0] == "1"
    assert (await env.get(one))["status"] == "preempted"
    assert [(await env.get(x))["status"] for x in many] == ["allocated"] * 8


async def test_a_whole_request_frees_the_device_with_the_fewest_slices(env: Env) -> None:
    await env.pool("pack", "t")
    await env.node("n1", ["0", "1"], memory=80000)
    a, b = await _slices(env, "s", 30000, 30000)  # pack: both on device 0
    c = await env.req({"gpu_memory_mb": 30000}, "s")  # device 0 is full enough: device 1
    assert [slice_of(x)[0] for x in (a, b, c)] == ["0", "0", "1"]
    whole = await env.req({"gpu": 1}, "t")
    assert whole["status"] == "queued"
    await env.reconcile()
    after = [(await env.get(x))["status"] for x in (a, b, c)]
    assert after == ["allocated", "allocated", "preempted"]
    whole = await env.get(whole)
    assert whole["status"] == "allocated" and whole["placement"]["devices"] == {"gpu": ["1"]}
    assert await env.violations() == []


async def test_a_slice_preempts_a_whole_holder_of_lower_priority(env: Env) -> None:
    await env.pool("pack", "t")
    await env.node("n1", ["0"], memory=80000)
    whole = await env.req({"gpu": 1}, "s")
    piece = await env.req({"gpu_memory_mb": 1000}, "t")
    assert piece["status"] == "queued"
    await env.reconcile()
    assert (await env.get(whole))["status"] == "preempted"
    assert (await env.get(piece))["status"] == "allocated"
    assert await env.violations() == []


async def test_no_useless_preemption_for_a_slice(env: Env) -> None:
    await env.pool("pack", "t")
    await env.node("n1", ["0"], memory=80000)
    mine = await _slices(env, "t", 70000)  # the high-priority subject's own slice
    low = await _slices(env, "s", 10000)
    high = await env.req({"gpu_memory_mb": 20000}, "t")
    await env.reconcile()
    # preempting s's 10000 MiB would not make room for 20000: nobody is preempted
    assert (await env.get(low[0]))["status"] == "allocated"
    assert (await env.get(mine[0]))["status"] == "allocated"
    assert (await env.get(high))["status"] == "queued"


async def test_drain_preempts_slices(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0"])
    piece = await env.req({"gpu_memory_mb": 1000})
    await env.conn.fetchval(
        "SELECT respool.set_node_state('n1', 'draining', p_now => $1)", env.now()
    )
    await env.reconcile()
    got = await env.get(piece)
    assert (got["status"], got["reason"]) == ("preempted", "node_drain")
    assert await env.violations() == []


async def test_what_if_names_the_slice_it_would_preempt(env: Env) -> None:
    await env.pool("pack", "t")
    await env.node("n1", ["0"], memory=80000)
    (low,) = await _slices(env, "s", 80000)
    body = {"subject": "t", "pool": "gpus", "resources": {"gpu_memory_mb": 1000}}
    doc = await env.conn.fetchval("SELECT respool.what_if_request($1)", body)
    assert doc["status"] == "queued"
    assert [w["id"] for w in doc["would_preempt"]] == [low["id"]]
    assert await env.conn.fetchval("SELECT count(*) FROM respool.requests") == 1


async def _batch(env: Env, members: list[dict[str, int]], *, gang: bool) -> list[dict[str, Any]]:
    rows = await env.conn.fetch(
        "SELECT request FROM respool.create_requests($1, p_all_or_nothing => $2, p_now => $3)"
        " ORDER BY member",
        [{"subject": "s", "pool": "gpus", "resources": m} for m in members],
        gang,
        env.now(),
    )
    return [r["request"] for r in rows]


async def test_a_batch_of_slices_fills_the_devices(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"], memory=40000)
    made = await _batch(env, [{"gpu_memory_mb": 15000}] * 6, gang=False)
    assert [m["status"] for m in made] == ["allocated"] * 4 + ["queued"] * 2
    assert sorted(slice_of(m)[0] for m in made[:4]) == ["0", "0", "1", "1"]
    assert await env.violations() == []


async def test_a_gang_of_slices_is_placed_all_or_none(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"], memory=40000)
    gang = await _batch(env, [{"gpu_memory_mb": 30000}, {"gpu_memory_mb": 30000}], gang=True)
    assert [m["status"] for m in gang] == ["allocated", "allocated"]
    assert sorted(slice_of(m)[0] for m in gang) == ["0", "1"]
    late = await _batch(env, [{"gpu_memory_mb": 10000}] * 3, gang=True)
    assert [m["status"] for m in late] == ["queued"] * 3  # two devices with 10000 left each
    await env.release(gang[0])
    assert [(await env.get(m))["status"] for m in late] == ["allocated"] * 3
    assert await env.violations() == []


async def test_a_gang_the_devices_cannot_hold_together_waits(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"], memory=40000)
    # the node's memory adds up (75000 of 80000), but each device holds one member only
    gang = await _batch(env, [{"gpu_memory_mb": 25000}] * 3, gang=True)
    assert {m["status"] for m in gang} <= {"queued", "rejected"}
    assert await env.conn.fetchval("SELECT count(*) FROM respool.device_slices") == 0
    assert await env.violations() == []


@pytest.mark.parametrize("twin", [None, "broken_slice_twin"])
async def test_broken_slice_twin_is_caught_by_i9(env: Env, twin: str | None) -> None:
    """Device 0 held whole, then a slice: the engine puts the slice on device 1; the twin (a held
    device still offers its room to slices, the CHECK gone) puts it on device 0, the first in
    list order with as much room, and invariant_violations reports I9."""
    if twin:
        await install_twin(env.conn, twin)
    await env.pool()
    await env.node("n1", ["0", "1"])
    whole = await env.req({"gpu": 1})
    piece = await env.req({"gpu_memory_mb": 1000})
    assert whole["placement"]["devices"] == {"gpu": ["0"]}
    found = [v["invariant"] for v in await env.violations()]
    if twin is None:
        assert slice_of(piece)[0] == "1" and found == []
    else:
        assert piece["status"] == "allocated" and slice_of(piece)[0] == "0"
        assert "I9" in found, found


async def test_a_whole_request_preempts_on_a_whole_only_node_of_a_sharing_pool(env: Env) -> None:
    await env.pool("pack", "t")
    await env.node("a", ["0"], mode=None)  # whole only
    await env.node("b", ["0"])  # shared
    low_a = await env.req({"gpu": 1}, "s", node_selector={"node": "a"})
    low_b = await _slices(env, "s", 1000, 1000)  # two victims on b
    high = await env.req({"gpu": 1}, "t")
    await env.reconcile()
    # one victim on a beats two on b
    assert (await env.get(low_a))["status"] == "preempted"
    assert [(await env.get(x))["status"] for x in low_b] == ["allocated", "allocated"]
    assert (await env.get(high))["placement"]["node"] == "a"
