"""Gangs of slices (docs/placement.md, "Sharing a GPU"): what a user who submits a gang of small
GPU jobs checks. The node's summed free memory is not enough: every member needs one device with
room, so a gang is granted when its members fit the devices, waits while they may fit later, and
is rejected ``no_fitting_node`` when no device arrangement could ever take them.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from test_shared_devices import Env, _batch, slice_of


@pytest.fixture
def env(conn: asyncpg.Connection) -> Env:
    return Env(conn)


async def statuses(env: Env, docs: list[dict[str, Any]]) -> list[str]:
    return [(await env.get(d))["status"] for d in docs]


async def test_a_gang_no_arrangement_of_devices_could_hold_is_rejected(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"], memory=40000)
    # 75,000 of the node's 80,000 MiB, but a 40,000 MiB device holds one 25,000 MiB member only
    gang = await _batch(env, [{"gpu_memory_mb": 25000}] * 3, gang=True)
    assert [(m["status"], m["reason"]) for m in gang] == [("rejected", "no_fitting_node")] * 3
    assert await env.conn.fetchval("SELECT count(*) FROM respool.device_slices") == 0
    assert await env.violations() == []


async def test_a_gang_is_placed_largest_slice_first_so_it_fits(env: Env) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"], memory=50000)
    # In this order, one slice after the other on the fullest device that fits would leave
    # 20,000 + 20,000 on device 0 and no room for the second 30,000: largest first fits all four.
    gang = await _batch(
        env,
        [{"gpu_memory_mb": m} for m in (20000, 20000, 30000, 30000)],
        gang=True,
    )
    assert [m["status"] for m in gang] == ["allocated"] * 4
    per_device: dict[str, int] = {}
    for m in gang:
        device, held = slice_of(m)
        per_device[device] = per_device.get(device, 0) + held["memory_mb"]
    assert per_device == {"0": 50000, "1": 50000}
    assert await env.violations() == []


async def test_a_gang_skips_a_node_whose_sum_fits_but_whose_devices_do_not(env: Env) -> None:
    await env.pool()
    await env.node("a", ["0", "1"], memory=40000)
    await env.node("b", ["0", "1"], memory=40000)
    # a: 25,000 free on each device (50,000 in all), b: one device empty
    for _ in range(2):
        await env.req({"gpu_memory_mb": 15000}, node_selector={"node": "a"})
    await env.req({"gpu_memory_mb": 40000}, node_selector={"node": "b"})
    gang = await _batch(env, [{"gpu_memory_mb": 30000}], gang=True)
    assert gang[0]["status"] == "allocated"
    assert gang[0]["placement"]["node"] == "b"
    assert await env.violations() == []


async def test_a_gang_that_fits_later_waits_and_is_granted_when_a_device_empties(
    env: Env,
) -> None:
    await env.pool()
    await env.node("n1", ["0", "1"], memory=40000)
    first = await env.req({"gpu_memory_mb": 25000})
    second = await env.req({"gpu_memory_mb": 25000})
    assert [slice_of(first)[0], slice_of(second)[0]] == ["0", "1"]
    # 30,000 free on the node, but 15,000 on each device: the 20,000 member fits none
    gang = await _batch(env, [{"gpu_memory_mb": 20000}, {"gpu_memory_mb": 10000}], gang=True)
    assert [m["status"] for m in gang] == ["queued"] * 2
    await env.release(first)
    assert await statuses(env, gang) == ["allocated"] * 2
    assert [slice_of(await env.get(m))[0] for m in gang] == ["0", "1"]
    assert await env.violations() == []
