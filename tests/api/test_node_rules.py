"""Node placement rules as an API client sees them (docs/placement.md): a node selector on a pool
without nodes is refused with ``no_fitting_node`` (HTTP 201, stored rejected, nothing granted);
a gang no arrangement of the pool's nodes can hold is rejected ``no_fitting_node`` at once."""

from __future__ import annotations

from typing import Any

import httpx

from support.http import make_request, ok
from support.server import Server


async def _pool(c: httpx.AsyncClient, name: str, **pool: Any) -> None:
    ok(await c.post("/v1/pools", json={"name": name, **pool}), 201)
    ok(await c.post("/v1/policies", json={"subject": "team", "pool": name}), 201)


async def test_selector_on_a_pool_without_nodes_is_rejected_no_fitting_node(
    server: Server,
) -> None:
    c = server.client
    await _pool(c, "plain", capacity={"gpu": 4})
    for body in (
        {"resources": {"gpu": 1}, "node_selector": {"gpu-type": "A100-80G"}},
        {"settings": {"gpu_count": 1, "gpu_class": "a100"}},
        {"resources": {"gpu": 1}, "node_selector": {"node": "gpu-box-1"}},
    ):
        r = await make_request(c, pool="plain", **body)
        assert (r["status"], r["reason"]) == ("rejected", "no_fitting_node"), r
        assert "plain has no nodes" in r["message"]
    pool = ok(await c.get("/v1/pools/plain"))
    assert pool["usage"].get("gpu", 0) == 0
    # Several candidates: the plain pool drops out, the node pool's a100 node serves it.
    await _pool(c, "nodes")
    box = {"name": "box", "pool": "nodes", "capacity": {"gpu": 1}}
    ok(await c.post("/v1/nodes", json=box | {"labels": {"gpu-class": "a100"}}), 201)
    first = await make_request(c, settings={"gpu_count": 1, "gpu_class": "a100"})
    second = await make_request(c, settings={"gpu_count": 1, "gpu_class": "a100"})
    assert (first["status"], first["pool"], first["placement"]["node"]) == (
        "allocated",
        "nodes",
        "box",
    )
    assert second["status"] == "queued"
    v100 = await make_request(c, settings={"gpu_count": 1, "gpu_class": "v100"})
    assert (v100["status"], v100["reason"]) == ("rejected", "no_fitting_node")


async def test_gang_no_arrangement_can_hold_is_rejected(server: Server) -> None:
    c = server.client
    await _pool(c, "gpus", starvation_seconds=0)
    for name in ("n1", "n2"):
        ok(
            await c.post("/v1/nodes", json={"name": name, "pool": "gpus", "capacity": {"gpu": 8}}),
            201,
        )
    member = {"subject": "team", "pool": "gpus", "resources": {"gpu": 5}}
    items = ok(
        await c.post("/v1/requests/batch", json={"all_or_nothing": True, "members": [member] * 3}),
        201,
    )["items"]
    assert {(m["status"], m["reason"]) for m in items} == {("rejected", "no_fitting_node")}
    # Nothing is held for it: the empty pool serves a 2-GPU request at once.
    r = await make_request(c, pool="gpus", resources={"gpu": 2})
    assert r["status"] == "allocated"
