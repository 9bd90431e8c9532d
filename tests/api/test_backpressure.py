"""Backpressure (docs/api.md, "Backpressure"): calls wait in a bounded line for a busy database
pool; past ``RESPOOL_MAX_PENDING`` a call is refused at once with 429 and ``Retry-After``,
having changed nothing; a queued call waits past the 10 s acquire bound instead of a 503."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.db import connect as connect_module
from app.db.connect import WaitLine
from support.http import error, ok, pool_with_policy, team_gpu
from support.server import Server, busy_pool, running_server

CREATE = "/v1/requests"


def line(server: Server) -> WaitLine:
    found: WaitLine = server.app.state.db.line
    return found


async def fill_line(
    server: Server, client: httpx.AsyncClient
) -> list[asyncio.Task[httpx.Response]]:
    """GETs until the line is full (the process's own liveness record may hold a place)."""
    tasks: list[asyncio.Task[httpx.Response]] = []
    for _ in range(200):
        if line(server).depth >= line(server).limit:
            return tasks
        tasks.append(asyncio.create_task(client.get("/v1/pools")))
        await asyncio.sleep(0.02)
    raise AssertionError("the line did not fill")


async def test_past_the_depth_429_with_retry_after_and_nothing_changed(db_url: str) -> None:
    async with running_server(db_url, db_pool_size=2, max_pending=3) as server:
        c = server.client
        await pool_with_policy(c, capacity={"gpu": 4})
        assert line(server).limit == 3
        limits = httpx.Limits(max_connections=20, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as h:
            async with busy_pool(server):
                waiting = await fill_line(server, h)
                refused = [
                    await h.post(CREATE, json=team_gpu(idempotency_key="k")),
                    await h.get("/v1/pools"),
                    await h.post("/v1/requests/batch", json={"members": [team_gpu()]}),
                ]
            answers = await asyncio.gather(*waiting)
        for r in refused:
            body = error(r, 429, None)
            assert r.headers["retry-after"] == "1"
            assert "RESPOOL_MAX_PENDING=3" in body["detail"]
        assert {r.status_code for r in answers} == {200}  # the calls in line were served
        assert ok(await c.get(CREATE, params={"limit": 1000}))["items"] == []  # nothing made
        # The same create again, the line empty: made now (the key was never used).
        assert ok(await c.post(CREATE, json=team_gpu(idempotency_key="k")), 201)["status"] == (
            "allocated"
        )
        assert line(server).depth == 0 and line(server).refused >= 3


async def test_pending_creates_count_in_the_line(db_url: str) -> None:
    async with running_server(db_url, db_pool_size=2, max_pending=4) as server:
        c = server.client
        await pool_with_policy(c, capacity={"gpu": 8})
        ok(await c.post(CREATE, json=team_gpu()), 201)
        limits = httpx.Limits(max_connections=20, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as h:
            async with busy_pool(server):
                tasks = []
                while line(server).depth < 4:
                    tasks.append(asyncio.create_task(h.post(CREATE, json=team_gpu())))
                    await asyncio.sleep(0.02)
                assert server.app.state.coalescer.pending >= 1
                error(await h.post(CREATE, json=team_gpu(labels={"late": "yes"})), 429)
            made = await asyncio.gather(*tasks)
        assert {r.status_code for r in made} <= {201, 429}
        created = sum(r.status_code == 201 for r in made)
        page = ok(await c.get(CREATE, params={"limit": 1000}))["items"]
        assert len(page) == 1 + created
        assert all(r["labels"] == {} for r in page)


async def test_a_queued_call_waits_past_the_acquire_bound(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connect_module, "ACQUIRE_TIMEOUT", 0.2)
    async with running_server(db_url, db_pool_size=1) as server:
        c = server.client
        await pool_with_policy(c, capacity={"gpu": 1})
        async with busy_pool(server):
            get = asyncio.create_task(c.get("/v1/pools"))
            create = asyncio.create_task(c.post(CREATE, json=team_gpu()))
            await asyncio.sleep(1.0)  # five acquire bounds: it used to be a 503 by now
            assert not get.done() and not create.done()
        assert ok(await get)[0]["name"] == "p"
        assert ok(await create, 201)["status"] == "allocated"


async def test_429_is_in_the_openapi_document(module_server: Server) -> None:
    doc = ok(await module_server.client.get("/schema/openapi.json"))
    for path, method in [
        ("/v1/requests", "post"),
        ("/v1/requests/batch", "post"),
        ("/v1/pools", "get"),
        ("/v1/requests/{request_id}/heartbeat", "post"),
    ]:
        responses = doc["paths"][path][method]["responses"]
        assert "429" in responses and "503" in responses, (path, method)
        assert "RESPOOL_MAX_PENDING" in responses["429"]["description"]
