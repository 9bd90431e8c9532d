"""Shared devices over HTTP (docs/placement.md, "Sharing a GPU"; docs/api.md): a node's sharing
fields in and out, the 400s naming the field, a slice's placement answer, the pool's derived
capacity, and what a PATCH of the sharing fields does to the slices."""

from __future__ import annotations

from typing import Any

import httpx

from support.http import error, ok
from support.placement import gpu_placement
from support.server import Server

GB80 = 81920


async def _pool(c: httpx.AsyncClient, placement: str = "pack") -> None:
    ok(await c.post("/v1/pools", json={"name": "gpus", "placement": placement}), 201)
    ok(await c.post("/v1/policies", json={"subject": "team", "pool": "gpus"}), 201)


async def _shared(c: httpx.AsyncClient, name: str = "n1", **extra: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "pool": "gpus",
        "devices": {"gpu": ["0", "1"]},
        "sharing": {"gpu": "mps"},
        "device_memory_mb": {"gpu": GB80},
        "reserved_memory_mb": {"gpu": 512},
        **extra,
    }
    made: dict[str, Any] = ok(await c.post("/v1/nodes", json=body), 201)
    return made


async def _ask(c: httpx.AsyncClient, resources: dict[str, int]) -> dict[str, Any]:
    body = {"subject": "team", "pool": "gpus", "resources": resources}
    got: dict[str, Any] = ok(await c.post("/v1/requests", json=body), 201)
    return got


async def test_node_sharing_fields_round_trip(server: Server) -> None:
    c = server.client
    await _pool(c)
    made = await _shared(c)
    assert made["sharing"] == {"gpu": "mps"}
    assert made["device_memory_mb"] == {"gpu": GB80}
    assert made["reserved_memory_mb"] == {"gpu": 512}
    offer = GB80 - 512
    assert made["capacity"] == {"gpu": 2, "gpu_memory_mb": 2 * offer, "gpu_share": 200}
    assert ok(await c.get("/v1/nodes/n1")) == made
    pool = ok(await c.get("/v1/pools/gpus"))
    assert pool["capacity"] == {"gpu": 2, "gpu_memory_mb": 2 * offer, "gpu_share": 200}
    plain = ok(await c.post("/v1/nodes", json={"name": "n2", "devices": {"gpu": ["0"]}}), 201)
    assert (plain["sharing"], plain["device_memory_mb"], plain["reserved_memory_mb"]) == (
        {}, {}, {},
    )  # fmt: skip


async def test_bad_node_sharing_fields_are_400_naming_the_field(server: Server) -> None:
    c = server.client
    await _pool(c)
    dev = {"devices": {"gpu": ["0"]}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({**dev, "sharing": {"gpu": "vgpu"}}, "sharing.gpu"),
        ({"capacity": {"gpu": 1}, "sharing": {"gpu": "mps"}}, "sharing.gpu"),
        ({**dev, "sharing": {"gpu": "mps"}}, "device_memory_mb.gpu"),
        ({**dev, "device_memory_mb": {"gpu": -5}}, "device_memory_mb.gpu"),
        (
            {**dev, "device_memory_mb": {"gpu": 100}, "reserved_memory_mb": {"gpu": 100}},
            "reserved_memory_mb.gpu",
        ),
    ]
    for body, field in cases:
        error(await c.post("/v1/nodes", json={"name": "n", **body}), 400, field)
    assert ok(await c.get("/v1/nodes")) == []


async def test_bad_slice_requests_are_400_naming_the_field(server: Server) -> None:
    c = server.client
    await _pool(c)
    await _shared(c)
    for resources, field in [
        ({"gpu": 1, "gpu_memory_mb": 1024}, "resources.gpu_memory_mb"),
        ({"gpu_share": 50}, "resources.gpu_memory_mb"),
        ({"gpu_memory_mb": 1024, "gpu_share": 150}, "resources.gpu_share"),
    ]:
        body = {"subject": "team", "pool": "gpus", "resources": resources}
        error(await c.post("/v1/requests", json=body), 400, field)
    assert ok(await c.get("/v1/requests"))["items"] == []


async def test_a_slice_answers_its_device_slice_and_isolation(server: Server) -> None:
    c = server.client
    await _pool(c)
    await _shared(c)
    got = await _ask(c, {"gpu_memory_mb": 20480, "gpu_share": 50})
    assert got["status"] == "allocated"
    assert got["placement"] == gpu_placement(
        "n1", ["0"], slices={"0": {"memory_mb": 20480, "share": 50}}, isolation="mps"
    )
    second = await _ask(c, {"gpu_memory_mb": 20480})
    assert second["placement"]["slices"] == {"gpu": {"0": {"memory_mb": 20480}}}
    whole = await _ask(c, {"gpu": 1})
    assert whole["placement"]["devices"] == {"gpu": ["1"]}
    assert whole["placement"]["isolation"] == {"gpu": "exclusive"}
    assert whole["placement"]["slices"] == {}
    # the node shows each allocation's slice
    node = ok(await c.get("/v1/nodes/n1"))
    by_id = {a["request_id"]: a for a in node["allocations"]}
    assert by_id[got["id"]]["slices"] == {"gpu": {"0": {"memory_mb": 20480, "share": 50}}}
    assert by_id[whole["id"]]["slices"] == {}
    offer = GB80 - 512
    assert node["usage"] == {"gpu": 1, "gpu_memory_mb": 40960 + offer, "gpu_share": 150}
    # release gives it back
    ok(await c.post(f"/v1/requests/{got['id']}/release"))
    node = ok(await c.get("/v1/nodes/n1"))
    assert node["usage"] == {"gpu": 1, "gpu_memory_mb": 20480 + offer, "gpu_share": 100}


async def test_patching_sharing_off_preempts_the_slices(server: Server) -> None:
    c = server.client
    await _pool(c)
    await _shared(c)
    piece = await _ask(c, {"gpu_memory_mb": 1024})
    node = ok(await c.patch("/v1/nodes/n1", json={"sharing": {"gpu": None}}))
    assert node["sharing"] == {} and node["capacity"] == {"gpu": 2}
    got = ok(await c.get(f"/v1/requests/{piece['id']}"))
    assert (got["status"], got["reason"]) == ("preempted", "capacity_shrink")
    assert "no longer shared" in got["message"]
