"""/v1/policies with windows, priority lanes and pattern subjects (docs/preemption.md, "Policy
shapes"), and the reconciler woken by a window boundary instead of its interval."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from support.http import error, ok
from support.server import Server, running_server

OFFICE = {"timezone": "Europe/Berlin", "days": ["fri", "mon"], "from": "09:00", "to": "17:00"}


async def test_windows_and_lane_round_trip(server: Server) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 8}}), 201)
    start = datetime.now(UTC) + timedelta(days=400)
    once = {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    body = {"subject": "prod", "pool": "p", "reserved": {"gpu": 4}, "priority_lane": True}
    pol = ok(await c.post("/v1/policies", json=body | {"windows": [OFFICE, once]}), 201)
    assert pol["priority_lane"] is True
    assert pol["windows"][0] == {**OFFICE, "days": ["mon", "fri"]}  # stored in week order
    assert datetime.fromisoformat(pol["windows"][1]["start"].replace("Z", "+00:00")) == start
    assert isinstance(pol["active"], bool)
    assert pol["next_change"] is not None  # office hours come round every week
    assert pol["reserved"] == {"gpu": 4} and pol["covers"] == []
    assert ok(await c.get(f"/v1/policies/{pol['id']}")) == pol

    # PATCH without windows keeps them; null removes them; a list replaces them.
    kept = ok(await c.patch(f"/v1/policies/{pol['id']}", json={"priority": 2}))
    assert (kept["windows"], kept["priority"]) == (pol["windows"], 2)
    always = ok(await c.patch(f"/v1/policies/{pol['id']}", json={"windows": None}))
    assert (always["windows"], always["active"], always["next_change"]) == (None, True, None)
    past = {"start": "2020-01-01T00:00:00Z", "end": "2020-01-02T00:00:00Z"}
    over = ok(
        await c.patch(f"/v1/policies/{pol['id']}", json={"windows": [past], "priority_lane": False})
    )
    assert (over["active"], over["next_change"], over["priority_lane"]) == (False, None, False)
    assert over["windows"] == [past]
    assert over["reserved"] == {"gpu": 4}  # the share as set, in force or not


@pytest.mark.parametrize(
    ("windows", "field"),
    [
        ([{"timezone": "Moon/Base", "from": "09:00", "to": "17:00"}], "windows[0].timezone"),
        ([OFFICE, {"from": "09:00", "to": "17:00"}], "windows[1].timezone"),
        (
            [{"start": "2026-03-02T00:00:00Z", "end": "2026-03-01T00:00:00Z"}],
            "windows[0].end",
        ),
        ([{**OFFICE, "start": "2026-03-01T00:00:00Z"}], "windows[0]"),
        ([], "windows"),
    ],
)
async def test_bad_windows_are_400_naming_the_field(
    server: Server, windows: list[dict[str, Any]], field: str
) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 8}}), 201)
    body = {"subject": "prod", "pool": "p", "windows": windows}
    error(await c.post("/v1/policies", json=body), 400, field)
    assert ok(await c.get("/v1/policies")) == []
    pol = ok(await c.post("/v1/policies", json={"subject": "prod", "pool": "p"}), 201)
    error(await c.patch(f"/v1/policies/{pol['id']}", json={"windows": windows}), 400, field)
    assert ok(await c.get(f"/v1/policies/{pol['id']}")) == pol


async def test_bad_window_shapes_are_400(server: Server) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 8}}), 201)
    for window in (
        {**OFFICE, "from": "9:00"},
        {**OFFICE, "days": ["monday"]},
        {**OFFICE, "every": "day"},
    ):
        body = {"subject": "prod", "pool": "p", "windows": [window]}
        answer = error(await c.post("/v1/policies", json=body), 400)
        # the body's decoder or the engine: either names the window's field
        assert answer["field"].startswith("windows") and answer["field"] != "windows", answer
    assert ok(await c.get("/v1/policies")) == []


async def test_overlapping_shares_and_pattern_ties_are_409(server: Server) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 8}}), 201)
    day = {"timezone": "UTC", "from": "08:00", "to": "20:00"}
    night = {"timezone": "UTC", "from": "20:00", "to": "08:00"}
    body = {"pool": "p", "reserved": {"gpu": 8}}
    ok(await c.post("/v1/policies", json={**body, "subject": "day", "windows": [day]}), 201)
    ok(await c.post("/v1/policies", json={**body, "subject": "night", "windows": [night]}), 201)
    late = {"timezone": "UTC", "from": "19:00", "to": "21:00"}
    refused = error(
        await c.post("/v1/policies", json={**body, "subject": "late", "windows": [late]}), 409
    )
    assert "reserved shares add up to 16 at " in refused["detail"]
    # The first such instant from now: 19:00 with day, or now itself (20:00-21:00) with night.
    assert "late reserves 8" in refused["detail"]
    assert "day reserves 8" in refused["detail"] or "night reserves 8" in refused["detail"]

    team = ok(await c.post("/v1/policies", json={"subject": "team-vision:*", "pool": "p"}), 201)
    assert team["covers"] == []
    tie = error(
        await c.post("/v1/policies", json={"subject": "team-vision:*:gpu", "pool": "p"}), 409
    )
    assert tie["field"] == "subject" and "team-vision:*" in tie["detail"]
    error(await c.post("/v1/policies", json={"subject": "team vision:*", "pool": "p"}), 400)
    longer = {"subject": "team-vision:big-*", "pool": "p"}
    ok(await c.post("/v1/policies", json=longer), 201)


async def test_the_reconciler_wakes_at_a_window_boundary(db_url: str) -> None:
    # A 30 s interval: only the boundary 1.5 s ahead can explain a reclaim well before it.
    async with running_server(db_url, with_reconciler=True, reconcile_interval=30.0) as srv:
        c = srv.client
        reconciler = srv.app.state.reconciler
        for _ in range(200):  # bounded: its first full pass, at start
            if reconciler.sweeps > 0:
                break
            await asyncio.sleep(0.05)
        ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 4}}), 201)
        ok(await c.post("/v1/policies", json={"subject": "dev", "pool": "p"}), 201)
        borrower = ok(
            await c.post("/v1/requests", json={"subject": "dev", "resources": {"gpu": 4}}), 201
        )
        assert borrower["status"] == "allocated"
        start = datetime.now(UTC) + timedelta(seconds=1.5)
        window = {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
        prod_policy = {"subject": "prod", "pool": "p", "reserved": {"gpu": 2}, "windows": [window]}
        assert ok(await c.post("/v1/policies", json=prod_policy), 201)["active"] is False
        prod = ok(
            await c.post("/v1/requests", json={"subject": "prod", "resources": {"gpu": 2}}), 201
        )
        assert prod["status"] == "queued"  # no share in force yet, equal priorities
        sweeps = reconciler.sweeps
        got = prod
        for _ in range(200):  # bounded poll: up to 10 s, a third of the interval
            got = ok(await c.get(f"/v1/requests/{prod['id']}"))
            if got["status"] == "allocated":
                break
            await asyncio.sleep(0.05)
        assert got["status"] == "allocated"
        assert reconciler.sweeps > sweeps  # a full pass at the boundary did it
        victim = ok(await c.get(f"/v1/requests/{borrower['id']}"))
        assert (victim["status"], victim["reason"]) == ("preempted", "reclaim")
        pol = ok(await c.get("/v1/policies", params={"subject": "prod"}))[0]
        assert pol["active"] is True
