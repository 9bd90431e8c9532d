"""/v1/policies: CRUD, filters and the 4xx answers."""

from __future__ import annotations

from support.http import error, ok
from support.server import Server


async def test_policy_crud_and_filters(server: Server) -> None:
    c = server.client
    for name in ("a", "b"):
        ok(await c.post("/v1/pools", json={"name": name, "capacity": {"gpu": 8}}), 201)
    pol = ok(
        await c.post(
            "/v1/policies",
            json={
                "subject": "orchestrator:prod",
                "pool": "a",
                "priority": 5,
                "reserved": {"gpu": 2},
                "limit": {"gpu": 6, "step_run": 4},
            },
        ),
        201,
    )
    assert pol["pool"] == "a" and pol["priority"] == 5 and pol["limit"]["step_run"] == 4
    ok(await c.post("/v1/policies", json={"subject": "other", "pool": "b"}), 201)
    ok(await c.post("/v1/policies", json={"subject": "orchestrator:prod", "pool": "b"}), 201)

    assert len(ok(await c.get("/v1/policies"))) == 3
    by_pool = ok(await c.get("/v1/policies", params={"pool": "b"}))
    assert sorted(p["subject"] for p in by_pool) == ["orchestrator:prod", "other"]
    by_subject = ok(await c.get("/v1/policies", params={"subject": "other"}))
    assert [p["pool"] for p in by_subject] == ["b"]
    both = ok(await c.get("/v1/policies", params={"pool": "a", "subject": "orchestrator:prod"}))
    assert [p["id"] for p in both] == [pol["id"]]
    assert "usage" in both[0] and "borrowed" in both[0]

    got = ok(await c.get(f"/v1/policies/{pol['id']}"))
    assert got["reserved"] == {"gpu": 2}
    patched = ok(
        await c.patch(f"/v1/policies/{pol['id']}", json={"priority": 1, "reserved": {"gpu": 3}})
    )
    assert patched["priority"] == 1 and patched["reserved"] == {"gpu": 3}
    assert patched["limit"] == {"gpu": 6, "step_run": 4}

    r = await c.delete(f"/v1/policies/{pol['id']}")
    assert r.status_code == 204
    error(await c.get(f"/v1/policies/{pol['id']}"), 404)


async def test_policy_errors(server: Server) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 8}}), 201)
    error(await c.post("/v1/policies", json={"subject": "s", "pool": "nope"}), 404)
    error(await c.get("/v1/policies", params={"pool": "nope"}), 404)
    body = {"subject": "s", "pool": "p", "reserved": {"gpu": 5}, "limit": {"gpu": 4}}
    error(await c.post("/v1/policies", json=body), 400)
    error(
        await c.post("/v1/policies", json={"subject": "s", "pool": "p", "reserved": {"gpu": -1}}),
        400,
        "reserved.gpu",
    )
    error(
        await c.post("/v1/policies", json={"subject": "s", "pool": "p", "weight": 1}),
        400,
        "weight",
    )
    error(
        await c.post("/v1/policies", json={"subject": "s", "pool": "p", "priority": 1.5}),
        400,
        "priority",
    )
    ok(
        await c.post("/v1/policies", json={"subject": "s", "pool": "p", "reserved": {"gpu": 6}}),
        201,
    )
    over = {"subject": "t", "pool": "p", "reserved": {"gpu": 3}}
    err = error(await c.post("/v1/policies", json=over), 409)
    assert "gpu" in err["detail"]
    dup = {"subject": "s", "pool": "p"}
    assert (await c.post("/v1/policies", json=dup)).status_code in (400, 409)
    error(await c.get("/v1/policies/00000000-0000-4000-8000-000000000000"), 404)
