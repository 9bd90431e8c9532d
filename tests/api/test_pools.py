"""/v1/pools: CRUD, refs, capacity merge and the 4xx answers."""

from __future__ import annotations

import asyncpg
import pytest

from support.http import error, make_request, ok, pool_with_policy
from support.server import Server


async def test_create_get_list_update_delete(server: Server) -> None:
    c = server.client
    created = ok(
        await c.post(
            "/v1/pools",
            json={"name": "gpu-a", "capacity": {"gpu": 8, "mcpu": 16000}, "description": "d"},
        ),
        201,
    )
    assert created["capacity"] == {"gpu": 8, "mcpu": 16000}
    assert created["queueing"] == "best_effort" and created["preemption_grace_seconds"] == 0
    pid = created["id"]

    for ref in ("gpu-a", pid, pid[:8]):
        got = ok(await c.get(f"/v1/pools/{ref}"))
        assert got["id"] == pid and got["queued"] == 0 and "usage" in got

    listed = ok(await c.get("/v1/pools"))
    assert [p["name"] for p in listed] == ["gpu-a"]

    updated = ok(
        await c.patch(
            "/v1/pools/gpu-a",
            json={"capacity": {"gpu": 4, "mcpu": 0, "tpu": 2}, "queueing": "strict"},
        )
    )
    assert updated["capacity"] == {"gpu": 4, "tpu": 2}
    assert updated["queueing"] == "strict" and updated["description"] == "d"

    r = await c.delete("/v1/pools/gpu-a")
    assert r.status_code == 204 and r.content == b""
    error(await c.get("/v1/pools/gpu-a"), 404)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "capacity": {"gpu": -1}}, "capacity.gpu"),
        ({"name": "x", "capacity": {"gpu": 1.5}}, "capacity.gpu"),
        ({"name": "x", "capacity": {"gpu": 2.0}}, "capacity.gpu"),
        ({"name": "x", "capacity": {"gpu": "2"}}, "capacity.gpu"),
        ({"name": "x", "capacity": {"Bad-Key": 1}}, "capacity.Bad-Key"),
        ({"name": "x", "capacity": {"gpu": 1}, "colour": "red"}, "colour"),
        ({"name": "Not A Name", "capacity": {"gpu": 1}}, "name"),
        ({"capacity": {"gpu": 1}}, "name"),
        ({"name": "x", "queueing": "fifo"}, "queueing"),
    ],
)
async def test_create_bad_input_names_the_field(
    module_server: Server, body: dict[str, object], field: str
) -> None:
    err = error(await module_server.client.post("/v1/pools", json=body), 400, field)
    assert field.split(".")[-1] in err["detail"]


async def test_malformed_json_is_400(module_server: Server) -> None:
    r = await module_server.client.post(
        "/v1/pools", content=b"{not json", headers={"content-type": "application/json"}
    )
    error(r, 400)


async def test_unknown_and_ambiguous_refs(server: Server) -> None:
    c = server.client
    error(await c.get("/v1/pools/nope"), 404)
    error(await c.patch("/v1/pools/nope", json={"description": "x"}), 404)
    error(await c.delete("/v1/pools/nope"), 404)
    conn = await asyncpg.connect(server.db_url)
    try:
        await conn.execute(
            "INSERT INTO respool.pools (id, name) VALUES"
            " ('abcd0000-0000-4000-8000-000000000001', 'one'),"
            " ('abcd0000-0000-4000-8000-000000000002', 'two')"
        )
    finally:
        await conn.close()
    err = error(await c.get("/v1/pools/abcd"), 400)
    assert "one" in err["detail"] or "abcd0000-0000-4000-8000-000000000001" in err["detail"]
    assert ok(await c.get("/v1/pools/abcd0000-0000-4000-8000-000000000002"))["name"] == "two"


async def test_capacity_below_reserved_is_409(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8}, reserved={"gpu": 6})
    err = error(await c.patch("/v1/pools/p", json={"capacity": {"gpu": 4}}), 409)
    assert "team" in err["detail"]
    assert ok(await c.get("/v1/pools/p"))["capacity"] == {"gpu": 8}


async def test_update_bad_input(server: Server) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
    error(await c.patch("/v1/pools/p", json={"capacity": {"gpu": -3}}), 400, "capacity.gpu")
    error(await c.patch("/v1/pools/p", json={"size": 3}), 400, "size")
    error(await c.patch("/v1/pools/p", json={"preemption_grace_seconds": -1}), 400)


async def test_delete_with_live_requests_needs_force(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 2})
    held = await make_request(c, resources={"gpu": 2})
    waiting = await make_request(c, resources={"gpu": 1})
    assert (held["status"], waiting["status"]) == ("allocated", "queued")
    assert ok(await c.get("/v1/pools/p"))["queued"] == 1

    error(await c.delete("/v1/pools/p"), 409)
    r = await c.delete("/v1/pools/p", params={"force": "true"})
    assert r.status_code == 204
    for req in (held, waiting):
        after = ok(await c.get(f"/v1/requests/{req['id']}"))
        assert after["status"] == "cancelled" and after["reason"] == "pool_deleted"
