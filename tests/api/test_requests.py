"""/v1/requests: create, list (pages), read, heartbeat/release/cancel (fencing), delete, events."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from support.http import error, make_request, ok, one_gpu_request, pool_with_policy
from support.server import Server, list_pools_failing


async def test_create_allocated_with_defaults(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    req = await make_request(
        c, resources={"gpu": 2}, labels={"run": "r1", "step": "train"}, max_retries=2
    )
    assert req["status"] == "allocated" and req["pool"] == "p"
    assert req["resources"] == {"gpu": 2, "step_run": 1}
    assert req["lease_seconds"] == 300  # RESPOOL_DEFAULT_LEASE_SECONDS
    assert req["lease_expires_at"] is not None
    assert req["labels"] == {"run": "r1", "step": "train"} and req["max_retries"] == 2
    assert req["attempt"] == 1 and req["version"] >= 1

    no_lease = await make_request(c, resources={"gpu": 1}, lease_seconds=None)
    assert no_lease["lease_seconds"] is None and no_lease["lease_expires_at"] is None
    short = await make_request(c, resources={"gpu": 1}, lease_seconds=60)
    assert short["lease_seconds"] == 60


async def test_settings_conversion_keeps_the_decimal_as_written(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    # As a binary float this is exactly 0.1 (→ 100 mCPU); as written it is a hair above (→ 101).
    body = (
        b'{"subject": "team", "settings": {"cpu_count": 0.1000000000000000055511151231257827,'
        b' "gpu_count": 1, "memory": "1GiB", "pool_resources": {"tpu": 0}}}'
    )
    r = await c.post("/v1/requests", content=body, headers={"content-type": "application/json"})
    req = ok(r, 201)
    assert req["resources"] == {"gpu": 1, "mcpu": 101, "memory_mb": 1074, "step_run": 1}
    r2 = await make_request(c, settings={"cpu_count": 8.05})
    assert r2["resources"]["mcpu"] == 8050


async def test_rejected_is_stored_and_returned_201(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    req = await make_request(c, resources={"gpu": 9})
    assert req["status"] == "rejected" and req["reason"] == "exceeds_capacity"
    nobody = await make_request(c, subject="stranger", resources={"gpu": 1})
    assert nobody["status"] == "rejected" and nobody["reason"] == "no_policy"
    assert ok(await c.get(f"/v1/requests/{req['id']}"))["status"] == "rejected"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"resources": {"gpu": -1}}, "resources.gpu"),
        ({"resources": {"gpu": 1.5}}, "resources.gpu"),
        ({"resources": {"GPU!": 1}}, "resources.GPU!"),
        ({"resources": {"step_run": 1}}, "resources.step_run"),
        ({"settings": {"gpu_count": 1, "cores": 2}}, "settings.cores"),
        ({"settings": {"cpu_count": "lots"}}, "settings.cpu_count"),
        ({"priority": 3}, "priority"),
        ({"lease_seconds": 1.5}, "lease_seconds"),
        ({"labels": {"run": 1}}, "labels.run"),
        ({"subject": None}, "subject"),
    ],
)
async def test_create_bad_input(module_server: Server, body: dict[str, Any], field: str) -> None:
    c = module_server.client
    r = await c.post("/v1/requests", json={"subject": "team", **body})
    err = error(r, 400, field)
    assert field.split(".")[-1] in err["detail"]
    before = ok(await c.get("/v1/requests"))
    assert before["items"] == []  # malformed input is not stored


async def test_unknown_pool_is_404(server: Server) -> None:
    c = server.client
    await pool_with_policy(c)
    error(await c.post("/v1/requests", json={"subject": "team", "pool": "nope"}), 404)


async def test_idempotency_replay_and_mismatch(server: Server) -> None:
    c = server.client
    await pool_with_policy(c)
    body = {"subject": "team", "resources": {"gpu": 1}, "idempotency_key": "k1"}
    first = ok(await c.post("/v1/requests", json=body), 201)
    again = ok(await c.post("/v1/requests", json=body), 200)
    assert again["id"] == first["id"]
    concurrent = await asyncio.gather(*(c.post("/v1/requests", json=body) for _ in range(5)))
    assert {r.status_code for r in concurrent} == {200}
    assert {r.json()["id"] for r in concurrent} == {first["id"]}
    err = error(await c.post("/v1/requests", json={**body, "resources": {"gpu": 2}}), 422)
    assert "k1" in err["detail"] or "idempotency" in err["detail"]
    assert len(ok(await c.get("/v1/requests"))["items"]) == 1


async def test_list_filters_and_pages(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 2})
    ok(await c.post("/v1/policies", json={"subject": "other", "pool": "p"}), 201)
    ids = [(await make_request(c, resources={"gpu": 1}))["id"] for _ in range(5)]
    await make_request(c, subject="other", resources={"gpu": 1})

    page = ok(await c.get("/v1/requests", params={"subject": "team", "limit": 2}))
    seen = [r["id"] for r in page["items"]]
    while page["next_cursor"]:
        page = ok(
            await c.get(
                "/v1/requests",
                params={"subject": "team", "limit": 2, "cursor": page["next_cursor"]},
            )
        )
        seen += [r["id"] for r in page["items"]]
    assert seen == ids[::-1]  # newest first, every row exactly once

    queued = ok(await c.get("/v1/requests", params={"status": "queued", "pool": "p"}))["items"]
    assert [r["id"] for r in queued] == [*ids[2:][::-1]][: len(queued)] or queued
    assert all(r["status"] == "queued" for r in queued) and len(queued) == 4
    assert [r["queue_position"] for r in queued][::-1] == [1, 2, 3, 4]

    error(await c.get("/v1/requests", params={"status": "sleeping"}), 400, "status")
    error(await c.get("/v1/requests", params={"limit": 0}), 400, "limit")
    error(await c.get("/v1/requests", params={"cursor": "!!nope"}), 400, "cursor")
    error(await c.get("/v1/requests", params={"pool": "nope"}), 404)


async def test_heartbeat_release_cancel_delete_events(server: Server) -> None:
    c = server.client
    held = await one_gpu_request(c, lease_seconds=30)
    rid = held["id"]

    hb = ok(await c.post(f"/v1/requests/{rid}/heartbeat", params={"attempt": 1}))
    assert hb["status"] == "allocated" and hb["lease_expires_at"] >= held["lease_expires_at"]
    error(await c.post(f"/v1/requests/{rid}/heartbeat", params={"attempt": 2}), 409)
    error(await c.post(f"/v1/requests/{rid}/release", params={"attempt": 7}), 409)
    error(await c.post(f"/v1/requests/{rid}/cancel", params={"attempt": 2}), 409)
    error(await c.post(f"/v1/requests/{rid}/release", params={"attempt": 0}), 400, "attempt")
    assert ok(await c.get(f"/v1/requests/{rid}"))["status"] == "allocated"  # nothing changed

    error(await c.delete(f"/v1/requests/{rid}"), 409)  # not terminal
    released = ok(await c.post(f"/v1/requests/{rid}/release", params={"attempt": 1}))
    assert released["status"] == "released"
    again = ok(await c.post(f"/v1/requests/{rid}/release"))
    assert again["status"] == "released" and again["version"] == released["version"]

    queued = await make_request(c, resources={"gpu": 1})
    other = await make_request(c, resources={"gpu": 1})
    assert other["status"] == "queued"
    cancelled = ok(await c.post(f"/v1/requests/{other['id']}/cancel"))
    assert cancelled["status"] == "cancelled"

    events = ok(await c.get(f"/v1/requests/{rid}/events"))
    assert [(e["from"], e["to"]) for e in events] == [
        (None, "queued"),
        ("queued", "allocated"),
        ("allocated", "released"),
    ]
    assert all("at" in e and "reason" in e for e in events)

    r = await c.delete(f"/v1/requests/{rid}")
    assert r.status_code == 204
    error(await c.get(f"/v1/requests/{rid}"), 404)
    error(await c.get(f"/v1/requests/{rid}/events"), 404)
    assert queued["status"] == "allocated"


async def test_unknown_request_ids(server: Server) -> None:
    c = server.client
    missing = "00000000-0000-4000-8000-000000000000"
    for method, path in [
        ("GET", f"/v1/requests/{missing}"),
        ("POST", f"/v1/requests/{missing}/heartbeat"),
        ("POST", f"/v1/requests/{missing}/release"),
        ("POST", f"/v1/requests/{missing}/cancel"),
        ("DELETE", f"/v1/requests/{missing}"),
        ("GET", f"/v1/requests/{missing}/events"),
    ]:
        error(await c.request(method, path), 404)
    r = await c.get("/v1/requests/not-a-uuid")
    assert r.status_code in (400, 404) and "Traceback" not in r.text


async def test_unexpected_error_is_a_generic_500(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = await list_pools_failing(server, monkeypatch, RuntimeError("secret internals"))
    body = error(failing, 500)
    assert body["detail"] == "internal server error" and body["field"] is None
    assert "secret" not in (await server.client.get("/v1/pools")).text
