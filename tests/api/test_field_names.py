"""A malformed body's 400 names the field as docs/api.md writes fields: list items in brackets,
map values by their key (``windows[0].days[1]``, ``devices.gpu[1]``,
``members[1].resources.gpu``), whether the decoder or the engine refuses it; nothing changes."""

from __future__ import annotations

from typing import Any

import pytest

from support.http import error, ok
from support.server import Server

WEEKLY = {"timezone": "UTC", "from": "09:00", "to": "10:00"}


@pytest.fixture
async def api(server: Server) -> Server:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 8}}), 201)
    ok(await c.post("/v1/policies", json={"subject": "s", "pool": "p"}), 201)
    ok(await c.post("/v1/nodes", json={"name": "n", "capacity": {"cpu": 4}}), 201)
    return server


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        # policies: windows are a list
        ("POST", "/v1/policies",
         {"subject": "t", "pool": "p", "windows": [{**WEEKLY, "days": ["mon", 3]}]},
         "windows[0].days[1]"),
        ("POST", "/v1/policies",
         {"subject": "t", "pool": "p", "windows": [WEEKLY, {**WEEKLY, "every": "day"}]},
         "windows[1].every"),
        ("POST", "/v1/policies",
         {"subject": "t", "pool": "p", "windows": [WEEKLY, {**WEEKLY, "from": 9}]},
         "windows[1].from"),
        ("PATCH", "/v1/policies/s@p", {"windows": [WEEKLY, WEEKLY, {**WEEKLY, "to": None, "x": 1}]},
         "windows[2].x"),
        ("POST", "/v1/policies",
         {"subject": "t", "pool": "p", "windows": [{**WEEKLY, "timezone": "localtime"}]},
         "windows[0].timezone"),  # the engine's check
        # nodes: devices map a key to a list of ids
        ("POST", "/v1/nodes", {"name": "m", "devices": {"cpu": ["a"], "gpu": ["0", 1]}},
         "devices.gpu[1]"),
        ("POST", "/v1/nodes", {"name": "m", "devices": {"gpu": "0,1"}}, "devices.gpu"),
        ("PATCH", "/v1/nodes/n", {"devices": {"gpu": None, "tpu": [0]}}, "devices.tpu[0]"),
        ("POST", "/v1/nodes", {"name": "m", "capacity": {"cpu": 1, "gpu": "8"}}, "capacity.gpu"),
        ("POST", "/v1/nodes", {"name": "m", "labels": {"zone": "a", "rack": 7}}, "labels.rack"),
        # batch members are a list of create bodies
        ("POST", "/v1/requests/batch",
         {"members": [{"subject": "s"}, {"subject": "s", "resources": {"cpu": 1, "gpu": "2"}}]},
         "members[1].resources.gpu"),
        ("POST", "/v1/requests/batch",
         {"members": [{"subject": "s"}, {"subject": "s"}, {"subject": "s", "bogus": 1}]},
         "members[2].bogus"),
        ("POST", "/v1/requests/batch",
         {"members": [{"subject": "s", "node_selector": {"zone": 3}}]},
         "members[0].node_selector.zone"),
        ("POST", "/v1/requests", {"subject": "s", "labels": {"a": "b", "c": ["d"]}}, "labels.c"),
    ],
)  # fmt: skip
async def test_a_malformed_body_names_the_field_in_the_documented_form(
    api: Server, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    c = api.client
    before = [ok(await c.get(p)) for p in ("/v1/policies", "/v1/nodes", "/v1/requests")]
    err = error(await c.request(method, path, json=body), 400, field)
    assert err["detail"].startswith(f"{field}:") or err["detail"].startswith(f"{field} "), err
    after = [ok(await c.get(p)) for p in ("/v1/policies", "/v1/nodes", "/v1/requests")]
    assert after == before
