"""/v1/nodes (docs/placement.md): register, list by pool and selector, read, update, delete,
cordon / drain / uncordon; the 4xx answers; who may write; pools backed by nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from support.db import issue_tokens
from support.http import error, get_request, make_request, ok
from support.placement import gpu_placement
from support.server import Server, running_server

ADMIN_TOKEN = "test-admin-token-nodes-0123456789"
EIGHT = [str(i) for i in range(8)]


async def node_pool(c: httpx.AsyncClient, name: str = "gpus", **pool: Any) -> dict[str, Any]:
    """A pool meant for nodes (no capacity) with a policy for subject ``team``."""
    made: dict[str, Any] = ok(await c.post("/v1/pools", json={"name": name, **pool}), 201)
    ok(await c.post("/v1/policies", json={"subject": "team", "pool": name}), 201)
    return made


async def add_node(c: httpx.AsyncClient, name: str, **body: Any) -> dict[str, Any]:
    body.setdefault("pool", "gpus")
    made: dict[str, Any] = ok(await c.post("/v1/nodes", json={"name": name, **body}), 201)
    return made


async def test_crud_round_trip(server: Server) -> None:
    c = server.client
    await node_pool(c, placement="spread")
    made = await add_node(
        c,
        "gpu-host-1",
        labels={"gpu-type": "A100-80G"},
        capacity={"mcpu": 64000},
        devices={"gpu": EIGHT},
    )
    assert made["pool"] == "gpus" and made["state"] == "active"
    assert made["capacity"] == {"gpu": 8, "mcpu": 64000} and made["devices"] == {"gpu": EIGHT}
    assert made["usage"] == {"gpu": 0, "mcpu": 0} and made["allocations"] == []
    assert ok(await c.get("/v1/nodes/gpu-host-1")) == made
    assert [n["name"] for n in ok(await c.get("/v1/nodes"))] == ["gpu-host-1"]

    pool = ok(await c.get("/v1/pools/gpus"))
    assert pool["capacity"] == {"gpu": 8, "mcpu": 64000}
    assert pool["nodes"] == 1 and pool["placement"] == "spread"

    changed = ok(
        await c.patch(
            "/v1/nodes/gpu-host-1",
            json={"labels": {"gpu-type": None, "zone": "a"}, "capacity": {"mcpu": 0}},
        )
    )
    assert changed["labels"] == {"zone": "a"} and changed["capacity"] == {"gpu": 8}

    r = await c.delete("/v1/nodes/gpu-host-1")
    assert r.status_code == 204 and r.content == b""
    error(await c.get("/v1/nodes/gpu-host-1"), 404, "name")
    assert ok(await c.get("/v1/pools/gpus"))["capacity"] == {}


async def test_list_by_pool_and_selector(server: Server) -> None:
    c = server.client
    await node_pool(c)
    await node_pool(c, "other")
    await add_node(c, "a1", labels={"gpu-type": "A100", "zone": "x"}, capacity={"gpu": 8})
    await add_node(c, "a2", labels={"gpu-type": "A100", "zone": "y"}, capacity={"gpu": 8})
    await add_node(c, "h1", pool="other", labels={"gpu-type": "H100"}, capacity={"gpu": 8})

    async def names(params: Any) -> list[str]:
        return [n["name"] for n in ok(await c.get("/v1/nodes", params=params))]

    assert await names({}) == ["a1", "a2", "h1"]
    assert await names({"pool": "gpus"}) == ["a1", "a2"]
    assert await names({"selector": "gpu-type=A100"}) == ["a1", "a2"]
    assert await names([("selector", "gpu-type=A100"), ("selector", "zone=y")]) == ["a2"]
    assert await names({"selector": "node=h1"}) == ["h1"]
    assert await names({"selector": "gpu-type=A100", "pool": "other"}) == []
    for bad in ("gpu-type", "=x", "Bad Key=x"):
        error(await c.get("/v1/nodes", params={"selector": bad}), 400, "selector")
    error(await c.get("/v1/nodes", params={"pool": "nope"}), 404, "pool")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "Not A Name"}, "name"),
        ({}, "name"),
        ({"name": "n", "colour": "red"}, "colour"),
        ({"name": "n", "labels": {"node": "x"}}, "labels.node"),
        ({"name": "n", "labels": {"k": "v" * 64}}, "labels.k"),
        ({"name": "n", "labels": {"Bad Key": "v"}}, "labels.Bad Key"),
        ({"name": "n", "capacity": {"gpu": -1}}, "capacity.gpu"),
        ({"name": "n", "capacity": {"gpu": "8"}}, "capacity.gpu"),
        ({"name": "n", "devices": {"gpu": ["0", "0"]}}, "devices.gpu"),
        ({"name": "n", "devices": {"gpu": []}}, "devices.gpu"),
        ({"name": "n", "devices": {"gpu": ["0"]}, "capacity": {"gpu": 2}}, "devices.gpu"),
        ({"name": "n", "state": "asleep"}, "state"),
    ],
)
async def test_bad_create_names_the_field_and_changes_nothing(
    module_server: Server, body: dict[str, Any], field: str
) -> None:
    c = module_server.client
    err = error(await c.post("/v1/nodes", json=body), 400, field)
    assert field.split(".")[-1] in err["detail"]
    assert ok(await c.get("/v1/nodes")) == []


async def test_duplicate_name_and_unknown_pool(server: Server) -> None:
    c = server.client
    await node_pool(c)
    await add_node(c, "n1", capacity={"gpu": 1})
    error(await c.post("/v1/nodes", json={"name": "n1"}), 409, "name")
    error(await c.post("/v1/nodes", json={"name": "n2", "pool": "nope"}), 404, "pool")
    error(await c.patch("/v1/nodes/ghost", json={"labels": {"a": "b"}}), 404, "name")
    error(await c.delete("/v1/nodes/ghost"), 404, "name")
    error(await c.post("/v1/nodes/ghost/cordon"), 404, "name")


async def test_unknown_query_parameter_is_400(server: Server) -> None:
    c = server.client
    await node_pool(c)
    await add_node(c, "n1", capacity={"gpu": 1})
    error(await c.delete("/v1/nodes/n1", params={"forse": "true"}), 400, "forse")
    error(await c.post("/v1/nodes/n1/drain", params={"force": "true"}), 400, "force")
    assert ok(await c.get("/v1/nodes/n1"))["state"] == "active"


async def test_pool_with_nodes_refuses_a_capacity(server: Server) -> None:
    c = server.client
    await node_pool(c)
    await add_node(c, "a", devices={"gpu": EIGHT})
    await add_node(c, "b", devices={"gpu": EIGHT}, state="draining")
    assert ok(await c.get("/v1/pools/gpus"))["capacity"] == {"gpu": 16}  # any state counts
    err = error(await c.patch("/v1/pools/gpus", json={"capacity": {"gpu": 4}}), 409, "capacity")
    assert "nodes" in err["detail"]
    assert ok(await c.get("/v1/pools/gpus"))["capacity"] == {"gpu": 16}
    assert (
        ok(await c.patch("/v1/pools/gpus", json={"placement": "spread"}))["placement"] == "spread"
    )
    error(await c.patch("/v1/pools/gpus", json={"placement": "scatter"}), 400, "placement")


async def test_reserved_shares_checked_when_a_node_leaves(server: Server) -> None:
    c = server.client
    await node_pool(c)
    await add_node(c, "a", capacity={"gpu": 8})
    await add_node(c, "b", capacity={"gpu": 8})
    ok(
        await c.post(
            "/v1/policies", json={"subject": "big", "pool": "gpus", "reserved": {"gpu": 12}}
        ),
        201,
    )
    err = error(await c.delete("/v1/nodes/b"), 409)
    assert "big reserves 12" in err["detail"]
    err = error(await c.patch("/v1/nodes/b", json={"pool": None}), 409)
    assert "big reserves 12" in err["detail"]
    assert ok(await c.get("/v1/nodes/b"))["pool"] == "gpus"


async def test_held_node_delete_and_move_need_force(server: Server) -> None:
    c = server.client
    await node_pool(c)
    await node_pool(c, "spare")
    await add_node(c, "a", devices={"gpu": ["0", "1"]})
    held = await make_request(c, pool="gpus", resources={"gpu": 2})
    assert held["status"] == "allocated"
    assert held["placement"] == gpu_placement("a", ["0", "1"])

    err = error(await c.delete("/v1/nodes/a"), 409, "force")
    assert "1 allocation" in err["detail"]
    error(await c.patch("/v1/nodes/a", json={"pool": "spare"}), 409, "force")
    assert (await get_request(c, held["id"]))["status"] == "allocated"

    moved = ok(await c.patch("/v1/nodes/a", params={"force": "true"}, json={"pool": "spare"}))
    assert moved["pool"] == "spare" and moved["allocations"] == []
    gone = await get_request(c, held["id"])
    assert (gone["status"], gone["reason"]) == ("preempted", "node_removed")
    assert ok(await c.get("/v1/pools/gpus"))["capacity"] == {}
    assert ok(await c.get("/v1/pools/spare"))["capacity"] == {"gpu": 2}

    again = await make_request(c, pool="spare", resources={"gpu": 1})
    assert again["placement"]["node"] == "a"
    r = await c.delete("/v1/nodes/a", params={"force": "true"})
    assert r.status_code == 204
    gone = await get_request(c, again["id"])
    assert (gone["status"], gone["reason"]) == ("preempted", "node_removed")


async def test_removed_device_preempts_its_holder(server: Server) -> None:
    c = server.client
    await node_pool(c)
    await add_node(c, "a", devices={"gpu": ["0", "1", "2", "3"]})
    first = await make_request(c, pool="gpus", resources={"gpu": 2})
    second = await make_request(c, pool="gpus", resources={"gpu": 2})
    assert second["placement"]["devices"] == {"gpu": ["2", "3"]}
    node = ok(await c.patch("/v1/nodes/a", json={"devices": {"gpu": ["0", "1", "2"]}}))
    assert node["capacity"] == {"gpu": 3}
    assert [a["request_id"] for a in node["allocations"]] == [first["id"]]
    lost = await get_request(c, second["id"])
    assert (lost["status"], lost["reason"]) == ("preempted", "capacity_shrink")
    assert (await get_request(c, first["id"]))["status"] == "allocated"


async def test_cordon_drain_uncordon(server: Server) -> None:
    c = server.client
    await node_pool(c)
    await add_node(c, "a", devices={"gpu": ["0"]})
    assert ok(await c.post("/v1/nodes/a/cordon"))["state"] == "cordoned"
    waiting = await make_request(c, pool="gpus", resources={"gpu": 1})
    assert waiting["status"] == "queued"  # a cordoned node takes no new grants
    assert ok(await c.post("/v1/nodes/a/drain"))["state"] == "draining"
    uncordoned = ok(await c.post("/v1/nodes/a/uncordon"))
    assert uncordoned["state"] == "active"
    assert [a["request_id"] for a in uncordoned["allocations"]] == [waiting["id"]]
    assert (await get_request(c, waiting["id"]))["status"] == "allocated"


async def test_openapi_shows_the_node_bodies(module_server: Server) -> None:
    doc = ok(await module_server.client.get("/schema/openapi.json"))
    paths = doc["paths"]
    assert {"/v1/nodes", "/v1/nodes/{name}", "/v1/nodes/{name}/drain"} <= set(paths)
    create = paths["/v1/nodes"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    update = paths["/v1/nodes/{name}"]["patch"]["requestBody"]["content"]["application/json"]
    assert create["$ref"].endswith("NodeCreate") and update["schema"]["$ref"].endswith("NodeUpdate")
    params = {p["name"] for p in paths["/v1/nodes"]["get"]["parameters"]}
    assert {"pool", "selector"} <= params


# --- roles ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def tokens_server(module_db_url: str) -> AsyncIterator[tuple[Server, dict[str, str]]]:
    issued = await issue_tokens(module_db_url)
    async with running_server(module_db_url, auth="on", admin_token=ADMIN_TOKEN) as srv:
        yield srv, issued


@pytest.mark.parametrize("role", ["client", "reader"])
async def test_only_admins_write_every_role_reads(
    tokens_server: tuple[Server, dict[str, str]], role: str
) -> None:
    srv, issued = tokens_server
    c = srv.client
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    caller = {"Authorization": f"Bearer {issued[role]}"}
    name = f"n-{role}"
    ok(await c.post("/v1/nodes", json={"name": name, "capacity": {"gpu": 1}}, headers=admin), 201)
    writes: list[tuple[str, str, Any]] = [
        ("POST", "/v1/nodes", {"name": f"x-{role}"}),
        ("PATCH", f"/v1/nodes/{name}", {"labels": {"a": "b"}}),
        ("DELETE", f"/v1/nodes/{name}", None),
        ("POST", f"/v1/nodes/{name}/cordon", None),
        ("POST", f"/v1/nodes/{name}/drain", None),
        ("POST", f"/v1/nodes/{name}/uncordon", None),
    ]
    for method, path, body in writes:
        error(await c.request(method, path, json=body, headers=caller), 403)
    assert ok(await c.get(f"/v1/nodes/{name}", headers=caller))["labels"] == {}
    assert name in [n["name"] for n in ok(await c.get("/v1/nodes", headers=caller))]
    assert ok(await c.get(f"/v1/nodes/{name}", headers=admin))["state"] == "active"
