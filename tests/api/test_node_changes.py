"""Node changes over HTTP (docs/placement.md): a node capacity of 0 on create is refused naming
the key; devices turned anonymous keep their holders; converting a plain pool whose policy
reserves units to nodes says what to do (detach or shrink the policy first)."""

from __future__ import annotations

import httpx

from support.http import error, ok
from support.server import Server


async def _pool(c: httpx.AsyncClient, **pool: object) -> None:
    ok(await c.post("/v1/pools", json={"name": "gpus", **pool}), 201)


async def test_node_capacity_of_zero_on_create_is_refused_naming_the_key(server: Server) -> None:
    c = server.client
    await _pool(c)
    body = error(
        await c.post(
            "/v1/nodes",
            json={"name": "n1", "pool": "gpus", "capacity": {"gpu": 4, "mcpu": 0}},
        ),
        400,
        "capacity.mcpu",
    )
    assert "positive" in body["detail"]
    # nothing was stored
    error(await c.get("/v1/nodes/n1"), 404)
    assert ok(await c.get("/v1/pools/gpus"))["capacity"] == {}


async def test_node_capacity_of_zero_on_update_removes_the_key(server: Server) -> None:
    c = server.client
    await _pool(c)
    ok(
        await c.post(
            "/v1/nodes", json={"name": "n1", "pool": "gpus", "capacity": {"gpu": 4, "mcpu": 8000}}
        ),
        201,
    )
    changed = ok(await c.patch("/v1/nodes/n1", json={"capacity": {"mcpu": 0}}))
    assert changed["capacity"] == {"gpu": 4}


async def test_devices_turned_anonymous_keep_every_holder(server: Server) -> None:
    c = server.client
    await _pool(c, preemption_grace_seconds=0)
    ok(
        await c.post(
            "/v1/nodes",
            json={"name": "n1", "pool": "gpus", "devices": {"gpu": ["0", "1", "2", "3"]}},
        ),
        201,
    )
    ok(
        await c.post(
            "/v1/policies", json={"subject": "team", "pool": "gpus", "reserved": {"gpu": 2}}
        ),
        201,
    )
    ids = []
    for preemptible in (True, False):
        body = {"subject": "team", "pool": "gpus", "resources": {"gpu": 2}}
        made = ok(await c.post("/v1/requests", json=body | {"preemptible": preemptible}), 201)
        assert made["status"] == "allocated"
        ids.append(made["id"])
    node = ok(await c.patch("/v1/nodes/n1", json={"devices": {"gpu": None}}))
    assert node["capacity"] == {"gpu": 4} and node["devices"] == {}
    assert node["usage"]["gpu"] == 4
    for rid in ids:
        got = ok(await c.get(f"/v1/requests/{rid}"))
        assert got["status"] == "allocated"
        assert got["placement"]["node"] == "n1"
        assert got["placement"]["devices"] == {}


async def test_converting_a_plain_pool_with_a_reservation_says_detach_or_shrink(
    server: Server,
) -> None:
    c = server.client
    await _pool(c, capacity={"gpu": 8})
    ok(
        await c.post(
            "/v1/policies", json={"subject": "team:a", "pool": "gpus", "reserved": {"gpu": 4}}
        ),
        201,
    )
    # Joining a node first: the pool has a capacity set by hand, and a policy reserves units.
    joined = error(
        await c.post("/v1/nodes", json={"name": "n1", "pool": "gpus", "capacity": {"gpu": 8}}),
        409,
    )
    assert "detach or shrink the policy first" in joined["detail"]
    assert "team:a" in joined["detail"]
    # Setting the capacity to 0 first: the reserved share needs it.
    emptied = error(await c.patch("/v1/pools/gpus", json={"capacity": {"gpu": 0}}), 409)
    assert "detach or shrink the policy first" in emptied["detail"]
    assert "team:a" in emptied["detail"]
    assert ok(await c.get("/v1/pools/gpus"))["capacity"] == {"gpu": 8}  # nothing changed
