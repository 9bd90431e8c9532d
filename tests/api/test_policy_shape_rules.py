"""Priority lanes, preemption groups and team quotas through the HTTP API (docs/preemption.md,
"Policy shapes"): what a user sees in the answers, with what-if naming the victims the
reconciler's next pass would take."""

from __future__ import annotations

from typing import Any

from support.http import ok
from support.server import Server


async def _setup(server: Server, *policies: dict[str, Any]) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 4}}), 201)
    for body in policies:
        ok(await c.post("/v1/policies", json={"pool": "p", **body}), 201)


async def _create(server: Server, subject: str, gpu: int, **kw: Any) -> dict[str, Any]:
    body = {"subject": subject, "resources": {"gpu": gpu}, **kw}
    answer: dict[str, Any] = ok(await server.client.post("/v1/requests", json=body), 201)
    return answer


async def _what_if(server: Server, subject: str, gpu: int, **kw: Any) -> dict[str, Any]:
    body = {"subject": subject, "resources": {"gpu": gpu}, **kw}
    answer: dict[str, Any] = ok(
        await server.client.post("/v1/requests", params={"dry_run": "true"}, json=body)
    )
    return answer


async def test_a_lane_request_is_first_and_would_preempt_any_priority(server: Server) -> None:
    await _setup(
        server,
        {"subject": "vip", "priority": 1000},
        {"subject": "oncall", "priority_lane": True},
    )
    held = await _create(server, "vip", 4)
    behind = await _create(server, "vip", 4)
    plan = await _what_if(server, "oncall", 4)
    assert [v["id"] for v in plan["would_preempt"]] == [held["id"]]
    lane = await _create(server, "oncall", 4)
    assert (lane["status"], lane["queue_position"]) == ("queued", 1)
    again = ok(await server.client.get(f"/v1/requests/{behind['id']}"))
    assert again["queue_position"] == 2


async def test_a_request_would_not_preempt_its_own_group(server: Server) -> None:
    await _setup(server, {"subject": "low"}, {"subject": "high", "priority": 10})
    mine = await _create(server, "low", 2, preemption_group="run-1")
    other = await _create(server, "low", 2)
    assert mine["preemption_group"] == "run-1" and other["preemption_group"] is None
    same = await _what_if(server, "high", 2, preemption_group="run-1")
    assert [v["id"] for v in same["would_preempt"]] == [other["id"]]
    all_of_it = await _what_if(server, "high", 4, preemption_group="run-1")
    assert all_of_it["would_preempt"] == [] and all_of_it["status"] == "queued"
    ungrouped = await _what_if(server, "high", 4)
    assert {v["id"] for v in ungrouped["would_preempt"]} == {mine["id"], other["id"]}


async def test_a_team_pattern_is_one_quota(server: Server) -> None:
    await _setup(server, {"subject": "team-vision:*", "limit": {"gpu": 3}})
    pattern = ok(await server.client.get("/v1/policies", params={"subject": "team-vision:*"}))[0]
    a = await _create(server, "team-vision:etl", 2)
    b = await _create(server, "team-vision:train", 2)
    assert (a["status"], b["status"]) == ("allocated", "queued")
    assert a["policy_id"] == pattern["id"]  # (set when granted)
    assert "limit" in b["message"]
    policy = ok(await server.client.get(f"/v1/policies/{pattern['id']}"))
    assert policy["usage"]["gpu"] == 2
    assert policy["covers"] == ["team-vision:etl", "team-vision:train"]
