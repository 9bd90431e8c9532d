"""A client token learns nothing about subjects its patterns do not cover (docs/api.md, "What a
client sees"): not through nodes, policies, its own requests' messages or their events. Admin and
reader tokens see everything.

Two teams share a pool with one node and a plain pool with the starvation guard: team-b's
borrowed allocation is reclaimed for team-a's request, then both hold GPUs on the node; in the
plain pool team-a's big request is the starving head and team-b's small one is held back for it.
Every read a client may make is searched, as serialized JSON, for the other team's request ids
(whole and as the 8-character prefix tables show) and subject.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from app.db import tokens
from support.db import client_token, direct, reconcile
from support.http import ok
from support.server import running_server

ADMIN = "rp_visibility-admin-token-0123456789abcdef"


async def _reader_token(db_url: str) -> str:
    async with direct(db_url) as conn:
        text, _ = await tokens.create_token(conn, name="visibility-reader", role="reader")
    return text


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _reads(c: httpx.AsyncClient, token: str, own: list[str]) -> dict[str, str]:
    """Every read a client token may make here, by path: its body as text."""
    h = _bearer(token)
    paths = [
        "/v1/nodes",
        "/v1/nodes/n1",
        "/v1/nodes?pool=np",
        "/v1/policies",
        "/v1/policies?pool=np",
        "/v1/pools",
        "/v1/pools/np",
        "/v1/pools/plain",
        "/v1/requests",
        "/v1/requests?status=preempted",
        "/v1/requests?status=queued",
        *(f"/v1/requests/{i}" for i in own),
        *(f"/v1/requests/{i}/events" for i in own),
    ]
    out = {}
    for path in paths:
        got = await c.get(path, headers=h)
        assert got.status_code == 200, (path, got.text)
        out[path] = got.text
    return out


def _leaks(bodies: dict[str, str], foreign: list[str]) -> list[tuple[str, str]]:
    return [(path, s) for path, body in bodies.items() for s in foreign if s in body]


def _node_holders(doc: dict[str, Any]) -> set[tuple[Any, Any]]:
    return {(a["request_id"], a["subject"]) for a in doc["allocations"]}


async def test_a_client_reads_nothing_of_another_team_on_any_route(db_url: str) -> None:
    token_a = await client_token(db_url, "team-a:*")
    token_b = await client_token(db_url, "team-b:*")
    reader = await _reader_token(db_url)
    async with running_server(db_url, auth="on", admin_token=ADMIN) as server:
        c = server.client
        h = _bearer(ADMIN)
        # a pool of one 4-GPU node: team-a reserves 2, team-b only borrows
        pool = {"name": "np", "preemption_grace_seconds": 0, "starvation_seconds": None}
        ok(await c.post("/v1/pools", headers=h, json=pool), 201)
        node = {"name": "n1", "pool": "np", "devices": {"gpu": ["0", "1", "2", "3"]}}
        ok(await c.post("/v1/nodes", headers=h, json=node), 201)
        team_a = {"subject": "team-a:*", "pool": "np", "reserved": {"gpu": 2}}
        ok(await c.post("/v1/policies", headers=h, json=team_a), 201)
        ok(await c.post("/v1/policies", headers=h, json={"subject": "team-b:*", "pool": "np"}), 201)
        # a plain pool whose starvation guard holds at once
        plain = {"name": "plain", "capacity": {"gpu": 4}, "starvation_seconds": 0}
        ok(await c.post("/v1/pools", headers=h, json=plain), 201)
        for s in ("team-a:*", "team-b:*"):
            ok(await c.post("/v1/policies", headers=h, json={"subject": s, "pool": "plain"}), 201)

        ha, hb = _bearer(token_a), _bearer(token_b)

        async def create(h: dict[str, str], subject: str, pool: str, gpu: int) -> Any:
            body = {"subject": subject, "pool": pool, "resources": {"gpu": gpu}}
            return ok(await c.post("/v1/requests", headers=h, json=body), 201)

        # team-b borrows the whole node; team-a's request reclaims it
        lost = await create(hb, "team-b:x", "np", 4)
        mine_a = await create(ha, "team-a:y", "np", 2)
        assert (lost["status"], mine_a["status"]) == ("allocated", "queued")
        async with direct(db_url) as conn:
            await reconcile(conn, "np")
        assert ok(await c.get(f"/v1/requests/{mine_a['id']}", headers=ha))["status"] == "allocated"
        # then both teams hold GPUs on the node
        mine_b = await create(hb, "team-b:x", "np", 2)
        assert mine_b["status"] == "allocated"
        # in the plain pool team-a's head starves and team-b's small request is held for it
        busy_b = await create(hb, "team-b:x", "plain", 3)
        head_a = await create(ha, "team-a:y", "plain", 4)
        held_b = await create(hb, "team-b:x", "plain", 1)
        assert (busy_b["status"], head_a["status"], held_b["status"]) == (
            "allocated",
            "queued",
            "queued",
        )

        # team-b's first request was reclaimed, its small one is held back for team-a's head
        assert ok(await c.get(f"/v1/requests/{lost['id']}", headers=h))["status"] == "preempted"
        held = ok(await c.get(f"/v1/requests/{held_b['id']}", headers=h))
        assert held["message"].startswith("held: pool reserves gpu for "), held["message"]

        ids_a = [mine_a["id"], head_a["id"]]
        ids_b = [lost["id"], mine_b["id"], busy_b["id"], held_b["id"]]
        a_strings = [*ids_a, *(i[:8] for i in ids_a), "team-a:y"]
        b_strings = [*ids_b, *(i[:8] for i in ids_b), "team-b:x"]

        # client tokens: nothing of the other team, anywhere
        seen_b = await _reads(c, token_b, ids_b)
        seen_a = await _reads(c, token_a, ids_a)
        leaks = _leaks(seen_b, a_strings) + _leaks(seen_a, b_strings)
        assert not leaks, sorted({path for path, _ in leaks})

        # ... but everything of their own
        node_b = json.loads(seen_b["/v1/nodes/n1"])
        assert _node_holders(node_b) == {(mine_b["id"], "team-b:x"), (None, None)}
        hidden = next(a for a in node_b["allocations"] if a["request_id"] is None)
        # the node's usage stays whole: the other holder's units and devices, not who it is
        assert (hidden["status"], hidden["resources"]["gpu"]) == ("allocated", 2)
        assert sorted(d for a in node_b["allocations"] for d in a["devices"]["gpu"]) == [
            "0",
            "1",
            "2",
            "3",
        ]
        assert json.loads(seen_b["/v1/nodes"])[0] == node_b
        node_a = json.loads(seen_a["/v1/nodes/n1"])
        assert _node_holders(node_a) == {(mine_a["id"], "team-a:y"), (None, None)}
        covers_b = {p["subject"]: p["covers"] for p in json.loads(seen_b["/v1/policies?pool=np"])}
        assert covers_b == {"team-a:*": [], "team-b:*": ["team-b:x"]}
        events_b = json.loads(seen_b[f"/v1/requests/{lost['id']}/events"])
        assert [
            (e["reason"], e["cause_request_id"], e["cause_subject"])
            for e in events_b
            if e["to"] == "preempted"
        ] == [("reclaim", None, None)]
        assert [e["message"] for e in events_b if e["to"] == "preempted"] == [
            "preempted (reclaim) for another request"
        ]
        own_held = json.loads(seen_b[f"/v1/requests/{held_b['id']}"])
        assert own_held["message"].startswith("held: pool reserves gpu for an earlier request")
        # a subject filter outside the token's patterns lists nothing
        other = ok(await c.get("/v1/requests?subject=team-a:y", headers=hb))
        assert other["items"] == []

        # admin and reader tokens see every holder, cover and cause
        for token in (ADMIN, reader):
            seen = await _reads(c, token, [*ids_a, *ids_b])
            node = json.loads(seen["/v1/nodes/n1"])
            assert _node_holders(node) == {
                (mine_a["id"], "team-a:y"),
                (mine_b["id"], "team-b:x"),
            }
            covers = {p["subject"]: p["covers"] for p in json.loads(seen["/v1/policies?pool=np"])}
            assert covers == {"team-a:*": ["team-a:y"], "team-b:*": ["team-b:x"]}
            # the preemption names team-a's request as data, not in its message
            events = json.loads(seen[f"/v1/requests/{lost['id']}/events"])
            assert [
                (e["reason"], e["message"], e["cause_request_id"], e["cause_subject"])
                for e in events
                if e["to"] == "preempted"
            ] == [("reclaim", "preempted (reclaim) for another request", mine_a["id"], "team-a:y")]
        # the dashboard, which shows every subject, stays closed to a client token
        assert (await c.get("/v1/dashboard", headers=hb)).status_code == 403
