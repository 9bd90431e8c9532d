"""Rate keys over HTTP (docs/rates.md): a pool declares them, a grant charges them, a release
with ``used`` settles, the reconciler grants when enough charges leave the window, and bad input
is 400 naming the field with nothing changed. Two ``respool serve`` processes on one database
never let a window exceed its amount."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from support.db import direct
from support.http import error, ok
from support.server import ServeProcess, Server, running_server

RATES = {"llm_tokens": {"amount": 10_000, "per_seconds": 2}}


async def llm_pool(c: httpx.AsyncClient, **rates: Any) -> dict[str, Any]:
    pool = ok(
        await c.post(
            "/v1/pools", json={"name": "llm", "capacity": {"gpu": 2}, "rates": rates or RATES}
        ),
        201,
    )
    for subject in ("team-a", "team-b"):
        ok(await c.post("/v1/policies", json={"subject": subject, "pool": "llm"}), 201)
    return dict(pool)


async def reserve(c: httpx.AsyncClient, subject: str, tokens: int, **q: Any) -> dict[str, Any]:
    body = {"subject": subject, "pool": "llm", "resources": {"llm_tokens": tokens}}
    return dict(ok(await c.post("/v1/requests", json=body, params=q), 201))


async def test_declare_charge_and_settle(server: Server) -> None:
    c = server.client
    pool = await llm_pool(c)
    assert pool["capacity"] == {"gpu": 2}
    assert pool["rates"]["llm_tokens"] == {
        "amount": 10_000,
        "per_seconds": 2,
        "used": 0,
        "next_refill_at": None,
        "overrun": 0,
    }
    r = await reserve(c, "team-a", 4000)
    assert r["status"] == "allocated"
    assert ok(await c.get("/v1/pools/llm"))["rates"]["llm_tokens"]["used"] == 4000
    done = ok(await c.post(f"/v1/requests/{r['id']}/release", json={"used": {"llm_tokens": 3120}}))
    assert done["status"] == "released"
    got = ok(await c.get("/v1/pools/llm"))
    assert got["rates"]["llm_tokens"]["used"] == 3120 and got["usage"]["llm_tokens"] == 3120
    history = ok(await c.get(f"/v1/requests/{r['id']}/events"))
    assert [e["reason"] for e in history if e["from"] == e["to"]] == ["settled"]
    # Without used the estimate stays charged.
    r2 = await reserve(c, "team-b", 1000)
    ok(await c.post(f"/v1/requests/{r2['id']}/release"))
    assert ok(await c.get("/v1/pools/llm"))["rates"]["llm_tokens"]["used"] == 4120


async def test_a_waiter_is_granted_when_the_window_passes(db_url: str) -> None:
    async with running_server(db_url, with_reconciler=True, reconcile_interval=30.0) as srv:
        c = srv.client
        await llm_pool(c)
        first = await reserve(c, "team-a", 9000)
        ok(await c.post(f"/v1/requests/{first['id']}/release"))
        waiting = await reserve(c, "team-b", 5000)
        assert waiting["status"] == "queued"
        assert waiting["eta"] is not None and waiting["eta"]["p50_seconds"] <= 2
        # The reconciler wakes at the refill instant (its interval here is 30 s).
        got = ok(await c.get(f"/v1/requests/{waiting['id']}", params={"wait": 8}))
        assert got["status"] == "allocated"


@pytest.mark.parametrize(
    ("rates", "field"),
    [
        ({"llm_tokens": {"amount": 0, "per_seconds": 60}}, "rates.llm_tokens.amount"),
        ({"llm_tokens": {"amount": -1, "per_seconds": 60}}, "rates.llm_tokens.amount"),
        ({"llm_tokens": {"amount": 5, "per_seconds": 0}}, "rates.llm_tokens.per_seconds"),
        ({"llm_tokens": {"amount": 5, "per_seconds": 86_401}}, "rates.llm_tokens.per_seconds"),
        ({"llm_tokens": {"amount": 5}}, "rates.llm_tokens.per_seconds"),
        ({"llm_tokens": {"amount": 5, "per_seconds": 1.5}}, "rates.llm_tokens.per_seconds"),
        ({"Bad": {"amount": 5, "per_seconds": 1}}, "rates.Bad"),
    ],
)
async def test_bad_rates_are_400_naming_the_field(
    module_server: Server, rates: dict[str, Any], field: str
) -> None:
    c = module_server.client
    error(await c.post("/v1/pools", json={"name": "bad", "rates": rates}), 400, field)
    error(await c.get("/v1/pools/bad"), 404)


async def test_rate_keys_and_nodes_and_capacity_do_not_mix(server: Server) -> None:
    c = server.client
    await llm_pool(c)
    error(
        await c.patch("/v1/pools/llm", json={"capacity": {"llm_tokens": 5}}),
        400,
        "capacity.llm_tokens",
    )
    error(
        await c.post(
            "/v1/pools",
            json={"name": "x", "capacity": {"k": 1}, "rates": {"k": RATES["llm_tokens"]}},
        ),
        400,
        "capacity.k",
    )
    ok(await c.post("/v1/pools", json={"name": "racks"}), 201)
    ok(await c.post("/v1/nodes", json={"name": "n1", "pool": "racks", "capacity": {"gpu": 2}}), 201)
    # a pool with nodes: a rate on a key its nodes track is refused, on another one it is the
    # pool's budget, and a node may not track it
    error(
        await c.patch("/v1/pools/racks", json={"rates": {"gpu": RATES["llm_tokens"]}}),
        400,
        "rates.gpu",
    )
    assert ok(await c.get("/v1/pools/racks"))["rates"] == {}
    racks = ok(await c.patch("/v1/pools/racks", json={"rates": RATES}))
    assert racks["capacity"] == {"gpu": 2}
    assert set(racks["rates"]) == {"llm_tokens"}
    error(
        await c.post(
            "/v1/nodes",
            json={"name": "n2", "pool": "racks", "capacity": {"gpu": 1, "llm_tokens": 5}},
        ),
        400,
        "capacity.llm_tokens",
    )
    error(await c.get("/v1/nodes/n2"), 404)
    # A rate key can change or go.
    changed = ok(await c.patch("/v1/pools/llm", json={"rates": {"llm_tokens": {"amount": 50}}}))
    assert changed["rates"]["llm_tokens"]["amount"] == 50
    assert changed["rates"]["llm_tokens"]["per_seconds"] == 2
    gone = ok(await c.patch("/v1/pools/llm", json={"rates": {"llm_tokens": None}}))
    assert gone["rates"] == {}


async def test_a_request_for_rate_keys_only_holds_no_node(server: Server) -> None:
    """In a pool backed by nodes, a request that asks only the pool's rate keys is charged on
    the pool and placed on no node: its placement is null, no node lists it among its
    allocations, and a node can go without force while it holds."""
    c = server.client
    hour = {"llm_tokens": {"amount": 10_000, "per_seconds": 3600}}  # no charge leaves meanwhile
    ok(await c.post("/v1/pools", json={"name": "racks", "rates": hour}), 201)
    ok(await c.post("/v1/policies", json={"subject": "team-a", "pool": "racks"}), 201)
    ok(await c.post("/v1/nodes", json={"name": "n1", "pool": "racks", "capacity": {"gpu": 2}}), 201)
    body = {"subject": "team-a", "pool": "racks", "resources": {"llm_tokens": 1000}}
    tokens = ok(await c.post("/v1/requests", json=body), 201)
    assert tokens["status"] == "allocated" and tokens["placement"] is None
    assert ok(await c.get(f"/v1/requests/{tokens['id']}"))["placement"] is None
    # A request that also asks a node's key is placed on the node, as before.
    both = {**body, "resources": {"gpu": 1, "llm_tokens": 1000}}
    mixed = ok(await c.post("/v1/requests", json=both), 201)
    assert mixed["placement"]["node"] == "n1"
    node = ok(await c.get("/v1/nodes/n1"))
    assert [a["request_id"] for a in node["allocations"]] == [mixed["id"]]
    assert node["usage"] == {"gpu": 1}
    ok(await c.post(f"/v1/requests/{mixed['id']}/release"))
    # With no active node left, a request for rate keys is still granted at once.
    ok(await c.post("/v1/nodes/n1/cordon"))
    more = ok(await c.post("/v1/requests", json=body), 201)
    assert more["status"] == "allocated" and more["placement"] is None
    assert ok(await c.get("/v1/nodes/n1"))["allocations"] == []
    # Invariant I7 (every holder in a pool with nodes is placed) does not count them.
    conn = await asyncpg.connect(server.db_url)
    try:
        assert [
            dict(v) for v in await conn.fetch("SELECT * FROM respool.invariant_violations")
        ] == []
    finally:
        await conn.close()
    # Nothing holds the node: it goes without force, and the holders of tokens keep them.
    r = await c.delete("/v1/nodes/n1")
    assert r.status_code == 204
    for held in (tokens, more):
        assert ok(await c.get(f"/v1/requests/{held['id']}"))["status"] == "allocated"
    done = ok(
        await c.post(f"/v1/requests/{tokens['id']}/release", json={"used": {"llm_tokens": 600}})
    )
    assert done["status"] == "released" and done["last_placement"] is None
    # (600 settled, 1000 each for the request with a GPU and the last one)
    assert ok(await c.get("/v1/pools/racks"))["rates"]["llm_tokens"]["used"] == 2600


@pytest.mark.parametrize(
    ("used", "status", "field"),
    [
        ({"gpu": 1}, 400, "used.gpu"),
        ({"llm_tokens": -1}, 400, "used.llm_tokens"),
        ({"llm_tokens": 1.5}, 400, "used.llm_tokens"),
        ({"unknown_key": 1}, 400, "used.unknown_key"),
    ],
)
async def test_bad_settlements_are_refused_and_change_nothing(
    server: Server, used: dict[str, Any], status: int, field: str
) -> None:
    c = server.client
    await llm_pool(c)
    body = {"subject": "team-a", "pool": "llm", "resources": {"gpu": 1, "llm_tokens": 4000}}
    r = ok(await c.post("/v1/requests", json=body), 201)
    error(await c.post(f"/v1/requests/{r['id']}/release", json={"used": used}), status, field)
    assert ok(await c.get(f"/v1/requests/{r['id']}"))["status"] == "allocated"
    pool = ok(await c.get("/v1/pools/llm"))
    assert pool["rates"]["llm_tokens"]["used"] == 4000 and pool["usage"]["gpu"] == 1


async def _reserve_loop(
    c: httpx.AsyncClient, subject: str, stop: float, counts: dict[str, int]
) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < stop:
        body = {"subject": subject, "pool": "llm", "resources": {"llm_tokens": 700}}
        r = ok(await c.post("/v1/requests", json=body, params={"wait": 1}), 201)
        if r["status"] == "allocated":
            counts["granted"] += 1
            ok(await c.post(f"/v1/requests/{r['id']}/release", json={"used": {"llm_tokens": 500}}))
        else:
            ok(await c.post(f"/v1/requests/{r['id']}/cancel"))


async def test_two_api_processes_share_one_budget(db_url: str, tmp_path: Path) -> None:
    """Every charge is checked in the database: two serve processes with their own reconcilers
    and concurrent callers on each never let a window pass its amount (I10)."""
    one = ServeProcess(db_url, tmp_path, name="one")
    two = ServeProcess(db_url, tmp_path, name="two")
    for serve in (one, two):
        serve.start()
    try:
        await one.ready()
        await two.ready()
        async with (
            httpx.AsyncClient(base_url=one.url, timeout=30) as a,
            httpx.AsyncClient(base_url=two.url, timeout=30) as b,
        ):
            await llm_pool(a, llm_tokens={"amount": 5000, "per_seconds": 1})
            counts = {"granted": 0}
            stop = asyncio.get_running_loop().time() + 4
            await asyncio.gather(
                *(
                    _reserve_loop(client, f"team-{'ab'[i % 2]}", stop, counts)
                    for i, client in enumerate([a, b] * 6)
                )
            )
        assert counts["granted"] > 5000 // 700  # more than one window's worth went through
        conn = await asyncpg.connect(db_url)
        try:
            violations = await conn.fetch("SELECT * FROM respool.invariant_violations")
            assert [dict(v) for v in violations] == []
            # The same, from the charges directly: no window of 1 s holds more than 5000
            # units.
            worst = await conn.fetchval(
                "SELECT max(s) FROM (SELECT (SELECT sum(c2.amount) FROM respool.rate_charges c2"
                " WHERE c2.at > c.at - interval '1 second' AND c2.at <= c.at) AS s"
                " FROM respool.rate_charges c) x"
            )
            assert worst <= 5000
        finally:
            await conn.close()
    finally:
        one.close()
        two.close()


async def test_gauges_dashboard_and_views_show_rate_keys(db_url: str) -> None:
    async with running_server(db_url, metrics_cache_seconds=0.0) as srv:
        c = srv.client
        await llm_pool(c)
        await reserve(c, "team-a", 4000)
        text = (await c.get("/metrics")).text
        assert 'respool_rate_used{key="llm_tokens",pool="llm",subject=""} 4000.0' in text
        assert 'respool_rate_amount{key="llm_tokens",pool="llm",subject=""} 10000.0' in text
        assert 'respool_rate_window_seconds{key="llm_tokens",pool="llm",subject=""} 2.0' in text
        assert 'respool_invariant_violations{invariant="I10"} 0.0' in text
        board = ok(await c.get("/v1/dashboard"))
        (key,) = [k for p in board["pools"] for k in p["keys"] if k["key"] == "llm_tokens"]
        assert key["per_seconds"] == 2 and key["allocated"] == 4000 and key["capacity"] == 10_000
        assert key["next_refill_at"] is not None
        async with direct(db_url) as conn:
            rows = await conn.fetch(
                "SELECT subject, used, amount FROM respool.rate_usage WHERE pool = 'llm'"
            )
        assert [tuple(r) for r in rows] == [("team-a", 4000, None), (None, 4000, 10_000)]
