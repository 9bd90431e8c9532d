"""Row 8: (admin, client, reader, revoked, none) × every ``/v1`` route of the OpenAPI document.

tests/api/test_auth.py holds the exact matrix (each case's expected status, 25 cases × 7
callers). This one takes the routes from ``/schema/openapi.json`` itself, so a route added
later is covered without editing a list, and checks the rules that hold for all of them:

* none and revoked: 401 with ``WWW-Authenticate: Bearer`` everywhere;
* reader: GET answers (not 401/403); any other method 403;
* client (``team-a:*``): GET on pools and policies answers, writes there 403; a request of
  another subject is 404 on every request route, creating one for it 403, listing answers;
  ``/v1/apply``, ``/v1/retention`` and ``/v1/dashboard`` (every subject) 403;
* agent routes (``/v1/agent/*``, claiming an attempt, writing its output): 403 for every
  caller but an agent token, admins included (docs/jobs.md);
* admin: never 401/403 elsewhere.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from app.db import tokens
from support.db import direct
from support.faults import record
from support.http import ok
from support.server import running_server

pytestmark = pytest.mark.faults

ADMIN = "rp_every-route-admin-token-0123456789abcdef"
ROLES = ("admin", "client", "reader", "revoked", "none")


def _expected(role: str, method: str, path: str) -> str:
    """'ok' (neither 401 nor 403) or the status code expected."""
    if role in ("none", "revoked"):
        return "401"
    agent_only = path.startswith("/v1/agent") or (
        method == "POST" and path.endswith(("/claim", "/logs"))
    )
    if agent_only:
        return "404" if role == "client" and path.startswith("/v1/requests/{") else "403"
    if role == "admin":
        return "ok"
    read = method in ("GET", "HEAD")
    if role == "reader":
        return "ok" if read else "403"
    # client, for subjects team-a:*; the request used in paths belongs to team-b:y
    if path == "/v1/dashboard":
        return "403"  # it shows every subject (docs/api.md)
    if path.startswith("/v1/requests/{"):
        return "404"
    if path == "/v1/requests":
        return "ok" if read else "403"  # the body asks for another subject
    return "ok" if read else "403"


async def test_every_route_for_every_caller(db_url: str) -> None:
    async with direct(db_url) as conn:
        client, _ = await tokens.create_token(
            conn, name="ci", role="client", subject_patterns=["team-a:*"]
        )
        reader, _ = await tokens.create_token(conn, name="dash", role="reader")
        revoked, _ = await tokens.create_token(conn, name="old", role="admin")
        await tokens.revoke_token(conn, "old")
    headers = {
        "admin": {"Authorization": f"Bearer {ADMIN}"},
        "client": {"Authorization": f"Bearer {client}"},
        "reader": {"Authorization": f"Bearer {reader}"},
        "revoked": {"Authorization": f"Bearer {revoked}"},
        "none": {},
    }
    cells: Counter[str] = Counter()
    mismatches: list[str] = []
    async with running_server(db_url, auth="on", admin_token=ADMIN) as server:
        c = server.client
        h = headers["admin"]
        ok(await c.post("/v1/pools", headers=h, json={"name": "p", "capacity": {"gpu": 9}}), 201)
        policy = ok(
            await c.post("/v1/policies", headers=h, json={"subject": "team-b:y", "pool": "p"}),
            201,
        )
        body = {"subject": "team-b:y", "resources": {"gpu": 1}}
        other = ok(await c.post("/v1/requests", headers=h, json=body), 201)
        doc = ok(await c.get("/schema/openapi.json"))
        routes = [
            (method.upper(), path)
            for path, ops in doc["paths"].items()
            if path.startswith("/v1")
            for method in ops
            if method in ("get", "post", "put", "patch", "delete")
        ]
        values = {"ref": "p", "request_id": other["id"], "policy_id": policy["id"]}
        # Admin goes last, and deletes come after everything else.
        for role in ROLES[1:] + ROLES[:1]:
            for method, path in sorted(routes, key=lambda r: r[0] == "DELETE"):
                concrete = re.sub(r"\{(\w+)(:\w+)?\}", lambda m: values.get(m[1], "p"), path)
                kw: dict[str, Any] = {}
                if method in ("POST", "PATCH", "PUT"):
                    kw["json"] = _body(path)
                r = await c.request(method, concrete, headers=headers[role], **kw)
                want = _expected(role, method, path)
                got = "ok" if r.status_code not in (401, 403) else str(r.status_code)
                if want == "404":
                    got = str(r.status_code) if r.status_code in (401, 403, 404) else got
                if role in ("none", "revoked") and r.headers.get("www-authenticate") != "Bearer":
                    got = f"{got} without WWW-Authenticate"
                cells[f"{role}:{got}"] += 1
                if got != want:
                    mismatches.append(f"{role} {method} {path}: {r.status_code} (want {want})")
    record(
        "row8 every route × (admin, client, reader, revoked, none)",
        routes=len(routes),
        cells=sum(cells.values()),
        answers=dict(sorted(cells.items())),
        mismatches=len(mismatches),
    )
    assert mismatches == [], mismatches
    assert len(routes) >= 20


def _body(path: str) -> dict[str, Any]:
    if path == "/v1/requests":
        return {"subject": "team-b:y", "resources": {"gpu": 1}}
    if path == "/v1/requests/batch":
        return {"members": [{"subject": "team-b:y", "resources": {"gpu": 1}}]}
    if path == "/v1/apply":
        return {"pools": [], "dry_run": True}
    if path == "/v1/retention/prune":
        return {"older_than": "3650d"}
    if path.startswith("/v1/pools"):
        return {"name": "q", "capacity": {"gpu": 1}}
    if path.startswith("/v1/policies"):
        return {"subject": "team-a:z", "pool": "p"}
    return {}
