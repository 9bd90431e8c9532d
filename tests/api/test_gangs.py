"""Gangs (docs/scheduling.md) through the API, the client and their filters:
POST /v1/requests/batch with all_or_nothing, GET /v1/requests?gang_id=,
create_many(all_or_nothing=True)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from respool_client import AsyncRespool, RequestCreate, Respool

from support.http import error, ok, pool_with_policy, team_gpu
from support.server import Server

BATCH = "/v1/requests/batch"


async def test_a_gang_waits_then_is_granted_whole(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 4})
    holder = ok(await c.post("/v1/requests", json=team_gpu(resources={"gpu": 2})), 201)
    body = {"members": [team_gpu(labels={"i": str(i)}) for i in range(3)], "all_or_nothing": True}
    items = ok(await c.post(BATCH, json=body), 201)["items"]
    gang_id = items[0]["gang_id"]
    assert gang_id and {r["gang_id"] for r in items} == {gang_id}
    assert [r["status"] for r in items] == ["queued"] * 3
    assert items[2]["message"].startswith(
        f"gang {gang_id}: waiting for gpu: pool 2/4 used, needs 3"
    )
    ok(await c.post(f"/v1/requests/{holder['id']}/release"))
    listed = ok(await c.get("/v1/requests", params={"gang_id": gang_id}))["items"]
    assert sorted(r["id"] for r in listed) == sorted(r["id"] for r in items)
    assert {r["status"] for r in listed} == {"allocated"}
    assert len({r["allocated_at"] for r in listed}) == 1
    # cancelling one member cancels the gang
    ok(await c.post(f"/v1/requests/{items[1]['id']}/cancel"))
    listed = ok(await c.get("/v1/requests", params={"gang_id": gang_id}))["items"]
    assert {r["status"] for r in listed} == {"cancelled"}
    assert {r["message"] for r in listed if r["id"] != items[1]["id"]} == {
        f"gang {gang_id}: member {items[1]['id']} was cancelled"
    }
    # singles have no gang
    assert holder["gang_id"] is None
    error(await c.get("/v1/requests", params={"gang_id": "nope"}), 400)


async def test_a_rejected_member_rejects_all(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 4})
    body = {"members": [team_gpu(), team_gpu(resources={"gpu": 5})], "all_or_nothing": True}
    items = ok(await c.post(BATCH, json=body), 201)["items"]
    assert [(r["status"], r["reason"]) for r in items] == [("rejected", "exceeds_capacity")] * 2
    assert items[0]["message"].startswith(f"gang {items[0]['gang_id']}: member {items[1]['id']}")


@pytest.mark.parametrize(
    ("other", "field"),
    [
        ({"subject": "other"}, "members[1].subject"),
        ({"pool": "q"}, "members[1].pool"),
        ({"preemptible": False}, "members[1].preemptible"),
        ({"max_retries": 1}, "members[1].max_retries"),
    ],
)
async def test_members_must_agree(module_server: Server, other: dict[str, Any], field: str) -> None:
    c = module_server.client
    if (await c.get("/v1/pools/p")).status_code == 404:  # the module's server: set up once
        await pool_with_policy(c, capacity={"gpu": 8})
        await pool_with_policy(c, pool="q", capacity={"gpu": 8})
    before = len(ok(await c.get("/v1/requests"))["items"])
    body = {"members": [team_gpu(), {**team_gpu(), **other}], "all_or_nothing": True}
    error(await c.post(BATCH, json=body), 400, field)
    assert len(ok(await c.get("/v1/requests"))["items"]) == before


async def test_client_create_many_all_or_nothing(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 2})
    body = RequestCreate(subject="team", pool="p", resources={"gpu": 1})
    async with AsyncRespool(server.url) as rp:
        made = await rp.create_many([body, body, body], all_or_nothing=True)
        assert [r.status for r in made] == ["rejected"] * 3  # 3 > capacity 2 together
        pair = await rp.create_many([body, body], all_or_nothing=True)
        assert [r.status for r in pair] == ["allocated"] * 2
        assert pair[0].gang_id is not None and pair[0].gang_id == pair[1].gang_id
        page = await rp.list_requests(gang_id=pair[0].gang_id)
        assert sorted(r.id for r in page.items) == sorted(r.id for r in pair)
    with Respool(server.url) as sync_rp:
        queued = await asyncio.to_thread(sync_rp.create_many, [body], all_or_nothing=True)
    assert [r.status for r in queued] == ["queued"] and queued[0].gang_id is not None
