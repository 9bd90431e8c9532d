"""/healthz, /readyz and the OpenAPI document."""

from __future__ import annotations

import asyncpg

from support.http import error, make_request, ok, pool_with_policy
from support.server import Server, running_server


async def test_healthz_readyz_and_schema(module_server: Server) -> None:
    c = module_server.client
    assert ok(await c.get("/healthz")) == {"status": "ok"}
    ready = ok(await c.get("/readyz"))
    node = ready.pop("node")  # host:port of the primary that serves (HA)
    # host:port over TCP; the embedded test server may be reached over its unix socket
    assert node == "local socket" or node.rsplit(":", 1)[1].isdigit()
    assert ready == {
        "ready": True,
        "database": True,
        "schema_current": True,
        "listener": True,
        "detail": None,
    }
    doc = ok(await c.get("/schema/openapi.json"))
    paths = doc["paths"]
    for path in (
        "/v1/pools",
        "/v1/pools/{ref}",
        "/v1/policies",
        "/v1/policies/{ref}",
        "/v1/requests",
        "/v1/requests/{request_id}",
        "/v1/requests/{request_id}/heartbeat",
        "/v1/requests/{request_id}/release",
        "/v1/requests/{request_id}/cancel",
        "/v1/requests/{request_id}/events",
        "/healthz",
        "/readyz",
    ):
        assert path in paths, path
    body = paths["/v1/requests"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("RequestCreate")
    assert "cpu_count" in str(doc["components"]["schemas"])
    assert (await c.get("/v1/nothing-here")).json()["status_code"] == 404
    assert (await c.get("/schema/swagger")).status_code == 200


async def test_bad_query_parameters_name_the_field(module_server: Server) -> None:
    c = module_server.client
    rid = "00000000-0000-4000-8000-000000000000"
    for path, params, field in [
        (f"/v1/requests/{rid}", {"wait": -1}, "wait"),
        (f"/v1/requests/{rid}", {"wait": "soon"}, "wait"),
        (f"/v1/requests/{rid}", {"version": "v2"}, "version"),
        ("/v1/requests", {"limit": "many"}, "limit"),
        ("/v1/pools/p", {"force": "maybe"}, "force"),
    ]:
        method = "DELETE" if path == "/v1/pools/p" else "GET"
        r = await c.request(method, path, params=params)
        error(r, 400, field)


async def test_readyz_reports_a_stale_schema(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("DELETE FROM respool.schema_repeatables")
    finally:
        await conn.close()
    async with running_server(db_url) as srv:
        r = await srv.client.get("/readyz")
        assert r.status_code == 503
        body = r.json()
        assert body["ready"] is False and body["schema_current"] is False
        assert body["database"] is True and "migrate" in body["detail"]


async def test_metrics(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 2})
    await make_request(c, resources={"gpu": 2})
    await make_request(c, resources={"gpu": 1})
    r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'respool_pool_capacity{key="gpu",pool="p"} 2.0' in text
    assert 'respool_pool_allocated{key="gpu",pool="p"} 2.0' in text
    assert 'respool_pool_queued_demand{key="gpu",pool="p"} 1.0' in text
    assert 'respool_requests{status="queued"} 1.0' in text
    assert "respool_listener_up 1.0" in text and "respool_waiters 0.0" in text
