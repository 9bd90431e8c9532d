"""POST /v1/requests/batch (docs/scheduling.md): one transaction, member order, idempotency."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from respool_client import ApiError, AsyncRespool, RequestCreate, Respool

from support.db import client_token
from support.http import error, ok, pool_with_policy, team_gpu
from support.server import ADMIN, Server, admin_server

BATCH = "/v1/requests/batch"


async def count(server: Server) -> int:
    page = ok(await server.client.get("/v1/requests", params={"limit": 1000}))
    return len(page["items"])


async def test_grants_in_member_order_and_queues_the_rest(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 3})
    body = {"members": [team_gpu(labels={"i": str(i)}) for i in range(5)]}
    items = ok(await c.post(BATCH, json=body), 201)["items"]
    assert [r["labels"]["i"] for r in items] == ["0", "1", "2", "3", "4"]
    assert [r["status"] for r in items] == ["allocated"] * 3 + ["queued"] * 2
    assert [r["queue_position"] for r in items] == [None, None, None, 1, 2]
    assert {r["lease_seconds"] for r in items} == {300}  # RESPOOL_DEFAULT_LEASE_SECONDS
    # the queue is in member order: releasing one grants member 3, not member 4
    ok(await c.post(f"/v1/requests/{items[0]['id']}/release"))
    got = [ok(await c.get(f"/v1/requests/{r['id']}"))["status"] for r in items[3:]]
    assert got == ["allocated", "queued"]


async def test_members_are_ordinary_create_bodies(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    body = {
        "members": [
            team_gpu(resources={"gpu": 9}),
            {"subject": "team", "settings": {"cpu_count": 0.5, "gpu_count": 2}, "max_retries": 2},
            team_gpu(lease_seconds=None, preemptible=False),
            {"subject": "stranger", "resources": {"gpu": 1}},
        ]
    }
    items = ok(await c.post(BATCH, json=body), 201)["items"]
    assert [(r["status"], r["reason"]) for r in items] == [
        ("rejected", "exceeds_capacity"),
        ("allocated", None),
        ("rejected", "exceeds_reserved"),
        ("rejected", "no_policy"),
    ]
    assert items[1]["resources"] == {"gpu": 2, "mcpu": 500, "step_run": 1}
    assert items[1]["max_retries"] == 2 and items[2]["lease_seconds"] is None


async def test_idempotency_per_member(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    single = ok(await c.post("/v1/requests", json=team_gpu(idempotency_key="a")), 201)
    body = {"members": [team_gpu(idempotency_key="a"), team_gpu(idempotency_key="b"), team_gpu()]}
    first = ok(await c.post(BATCH, json=body), 201)["items"]
    again = ok(await c.post(BATCH, json=body), 201)["items"]
    assert first[0]["id"] == again[0]["id"] == single["id"]
    assert first[1]["id"] == again[1]["id"]
    assert first[2]["id"] != again[2]["id"]  # no key: a new request each time
    assert await count(server) == 4
    # the same key with another body refuses the whole batch
    changed = {"members": [team_gpu(), team_gpu(idempotency_key="b", resources={"gpu": 2})]}
    error(await c.post(BATCH, json=changed), 422, "members[1].idempotency_key")
    assert await count(server) == 4


@pytest.mark.parametrize(
    ("bad", "status", "field"),
    [
        ({"subject": "team", "resources": {"GPU": 1}}, 400, "members[1].resources.GPU"),
        ({"subject": "team", "resources": {"gpu": "1"}}, 400, "members[1].resources"),
        ({"subject": "team", "colour": "red"}, 400, "members[1].colour"),
        ({"resources": {"gpu": 1}}, 400, "members[1].subject"),
        ({"subject": "team", "max_retries": -1}, 400, "members[1].max_retries"),
        ({"subject": "team", "settings": {"cpu_count": "1"}}, 400, "members[1].settings.cpu_count"),
        ({"subject": "team", "pool": "nope"}, 404, "members[1].pool"),
        ({"subject": "team", "labels": {"": "x"}}, 400, "members[1].labels."),
    ],
)
async def test_a_bad_member_creates_nothing(
    module_server: Server, bad: dict[str, Any], status: int, field: str
) -> None:
    c = module_server.client
    if (await c.get("/v1/pools/p")).status_code == 404:  # the module's server: set up once
        await pool_with_policy(c, capacity={"gpu": 8})
    before = await count(module_server)
    r = await c.post(BATCH, json={"members": [team_gpu(), bad, team_gpu()]})
    body = error(r, status)
    assert body["field"] is not None and body["field"].startswith(field), body
    assert await count(module_server) == before


async def test_batch_shape(module_server: Server) -> None:
    c = module_server.client
    error(await c.post(BATCH, json={"members": []}), 400, "members")
    error(await c.post(BATCH, json={"members": [team_gpu()] * 1001}), 400, "members")
    error(await c.post(BATCH, json={}), 400, "members")
    error(await c.post(BATCH, json={"members": [team_gpu()], "extra": 1}), 400, "extra")
    error(await c.post(BATCH, json={"members": [team_gpu()], "all_or_nothing": 1}), 400)


@pytest.mark.slow  # a scale test (tests/api/test_scale.py has the others)
async def test_a_thousand_members(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 600})
    items = ok(await c.post(BATCH, json={"members": [team_gpu()] * 1000}), 201)["items"]
    assert len(items) == 1000 and len({r["id"] for r in items}) == 1000
    assert [r["status"] for r in items] == ["allocated"] * 600 + ["queued"] * 400
    assert [r["queue_position"] for r in items[600:]] == list(range(1, 401))


async def test_every_member_subject_must_be_allowed(db_url: str) -> None:
    token = await client_token(db_url, "team-a:*")
    async with admin_server(db_url, pool_gpus=8) as server:
        c, h = server.client, ADMIN
        for s in ("team-a:x", "team-b:y"):
            ok(await c.post("/v1/policies", headers=h, json={"subject": s, "pool": "p"}), 201)
        mine = {"subject": "team-a:x", "resources": {"gpu": 1}}
        theirs = {"subject": "team-b:y", "resources": {"gpu": 1}}
        auth = {"Authorization": f"Bearer {token}"}
        error(await c.post(BATCH, headers=auth, json={"members": [mine, theirs]}), 403)
        listed = ok(await c.get("/v1/requests", headers=h))["items"]
        assert listed == []
        items = ok(await c.post(BATCH, headers=auth, json={"members": [mine, mine]}), 201)["items"]
        assert [r["status"] for r in items] == ["allocated", "allocated"]


# --- the client: Respool.create_many / AsyncRespool.create_many ------------------------------


async def test_client_create_many(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 2})
    body = RequestCreate(subject="team", pool="p", resources={"gpu": 1})
    async with AsyncRespool(server.url) as rp:
        made = await rp.create_many([body, body, body])
        assert [r.status for r in made] == ["allocated", "allocated", "queued"]
        assert made[0].lease_seconds == 300  # absent lease_seconds: the server's default
        # every member got an idempotency key of its own, so a retried batch creates nothing new
        keys = [r.idempotency_key for r in made]
        assert None not in keys and len(set(keys)) == 3
        keyed = [msgspec.structs.replace(body, idempotency_key=k) for k in keys]
        assert [r.id for r in await rp.create_many(keyed)] == [r.id for r in made]
        with pytest.raises(ApiError) as info:
            await rp.create_many([body, RequestCreate(subject="team", pool="nope")])
        assert (info.value.status_code, info.value.field) == (404, "members[1].pool")
    with Respool(server.url) as sync_rp:
        more = await asyncio.to_thread(sync_rp.create_many, [body])
    assert [r.status for r in more] == ["queued"] and more[0].queue_position == 2
    assert await count(server) == 4
