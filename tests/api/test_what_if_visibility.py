"""What-if for a client token: it names only the victims the token may read (docs/api.md)."""

from __future__ import annotations

from support.db import client_token
from support.http import error, ok
from support.server import ADMIN, admin_server


async def test_a_client_what_if_shows_only_its_own_victims_by_id(db_url: str) -> None:
    """A client token's what-if names a victim (id, subject) only when the token may read
    that request; of another subject's allocation it learns the pool and the resources."""
    token = await client_token(db_url, "owner:*")
    async with admin_server(db_url, pool_gpus=2) as server:
        c, h = server.client, ADMIN
        owner = {"subject": "owner:a", "pool": "p", "reserved": {"gpu": 2}}
        ok(await c.post("/v1/policies", headers=h, json=owner), 201)
        for s in ("owner:b", "borrower"):
            ok(await c.post("/v1/policies", headers=h, json={"subject": s, "pool": "p"}), 201)
        body = {"subject": "borrower", "pool": "p", "resources": {"gpu": 1}}
        theirs = ok(await c.post("/v1/requests", headers=h, json=body), 201)
        mine_body = {"subject": "owner:b", "pool": "p", "resources": {"gpu": 1}}
        auth = {"Authorization": f"Bearer {token}"}
        mine = ok(await c.post("/v1/requests", headers=auth, json=mine_body), 201)
        assert theirs["status"] == mine["status"] == "allocated"
        ask = {"subject": "owner:a", "pool": "p", "resources": {"gpu": 2}}
        what = ok(await c.post("/v1/requests?dry_run=true", headers=auth, json=ask))
        victims = {
            (v["id"], v["subject"], v["pool"]): v["resources"] for v in what["would_preempt"]
        }
        # the token cannot read the borrower's request, so the what-if does not name it either
        error(await c.get(f"/v1/requests/{theirs['id']}", headers=auth), 404)
        assert victims == {
            (None, None, "p"): {"gpu": 1, "step_run": 1},  # the borrower's
            (mine["id"], "owner:b", "p"): {"gpu": 1, "step_run": 1},  # the token's own subject's
        }, what["would_preempt"]
        # an admin sees every victim in full
        full = ok(await c.post("/v1/requests?dry_run=true", headers=h, json=ask))
        assert {(v["id"], v["subject"]) for v in full["would_preempt"]} == {
            (theirs["id"], "borrower"),
            (mine["id"], "owner:b"),
        }
