"""A route that changes state refuses a query parameter it does not take (400 naming it), so a
misspelled ``dry_run`` or a what-if on the batch route never creates anything (docs/api.md)."""

from __future__ import annotations

import pytest

from support.http import error, ok, pool_with_policy, team_gpu
from support.server import Server


async def _count(server: Server) -> int:
    return len(ok(await server.client.get("/v1/requests", params={"limit": 1000}))["items"])


@pytest.mark.parametrize(
    ("path", "param", "body"),
    [
        ("/v1/requests", "dryrun", team_gpu()),
        ("/v1/requests", "dry-run", team_gpu()),
        ("/v1/requests", "Dry_Run", team_gpu()),
        ("/v1/requests/batch", "dry_run", {"members": [team_gpu(), team_gpu()]}),
        ("/v1/requests/batch", "wait", {"members": [team_gpu()]}),
    ],
)
async def test_an_unknown_query_parameter_creates_nothing(
    module_server: Server, path: str, param: str, body: object
) -> None:
    c = module_server.client
    if (await c.get("/v1/pools/p")).status_code == 404:  # the module's server: set up once
        await pool_with_policy(c, capacity={"gpu": 8})
    before = await _count(module_server)
    answer = error(await c.post(path, params={param: "true"}, json=body), 400, param)
    assert param in answer["detail"]
    assert await _count(module_server) == before


async def test_every_state_changing_route_checks_its_query(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    r = ok(await c.post("/v1/requests", json=team_gpu()), 201)
    error(await c.post(f"/v1/requests/{r['id']}/release", params={"atempt": "1"}), 400, "atempt")
    assert ok(await c.get(f"/v1/requests/{r['id']}"))["status"] == "allocated"
    error(await c.delete("/v1/pools/p", params={"forse": "true"}), 400, "forse")
    error(await c.patch("/v1/pools/p", params={"x": "1"}, json={"description": "d"}), 400, "x")
    assert ok(await c.get("/v1/pools/p"))["description"] == ""
    # the parameters a route takes still work, and reads keep ignoring unknown ones
    what = ok(await c.post("/v1/requests", params={"dry_run": "true"}, json=team_gpu()))
    assert what["would_preempt"] == []
    ok(await c.post(f"/v1/requests/{r['id']}/release", params={"attempt": "1"}))
    ok(await c.get("/v1/requests", params={"whatever": "1"}))
