"""Numbers no field can take answer 400 naming the field, in a plain sentence, and create
nothing; no amount is so large that a sum of them breaks a view, the dashboard or /metrics
(docs/api.md, "Numbers and bounds")."""

from __future__ import annotations

import httpx
import pytest
from respool_client.wire import MAX_AMOUNT

from support.db import direct
from support.http import error, ok
from support.server import Server

JSON = {"content-type": "application/json"}
HUGE = "9" * 30  # beyond int64
DIGITS = "1" + "0" * 5000  # beyond what a JSON decoder turns into an integer
MEMBER = '{"members": [{"subject": "team"}, {"subject": "team"}, {"subject": "team", %s}]}'
REQUEST = '{"subject": "team", %s}'

# (path, body with N standing for the number, the number, the field the 400 names)
CASES = [
    ("/v1/pools", '{"name": "q", "capacity": {"gpu": N}}', HUGE, "capacity.gpu"),
    ("/v1/pools", '{"name": "q", "capacity": {"gpu": N}}', "1e400", "capacity.gpu"),
    ("/v1/pools", '{"name": "q", "capacity": {"gpu": N}}', DIGITS, "capacity.gpu"),
    ("/v1/pools", '{"name": "q", "capacity": {"gpu": N}}', str(MAX_AMOUNT + 1), "capacity.gpu"),
    ("/v1/pools", '{"name": "q", "preemption_grace_seconds": N}', "1e400",
     "preemption_grace_seconds"),
    ("/v1/policies", '{"subject": "t2", "pool": "p", "limit": {"gpu": N}}', HUGE, "limit.gpu"),
    ("/v1/policies", '{"subject": "t2", "pool": "p", "priority": N}', "1e400", "priority"),
    ("/v1/requests", REQUEST % '"resources": {"gpu": N}', HUGE, "resources.gpu"),
    ("/v1/requests", REQUEST % '"resources": {"gpu": N}', "-1e400", "resources.gpu"),
    ("/v1/requests", REQUEST % '"resources": {"memory_mb": N}', str(2**63 - 1),
     "resources.memory_mb"),
    ("/v1/requests", REQUEST % '"settings": {"cpu_count": N}', "1e400", "settings.cpu_count"),
    ("/v1/requests", REQUEST % '"settings": {"cpu_count": N}', "1e300", "settings.cpu_count"),
    ("/v1/requests", REQUEST % '"settings": {"cpu_count": N}', DIGITS, "settings.cpu_count"),
    ("/v1/requests", REQUEST % '"settings": {"cpu_count": N}', "1e-5000", "settings.cpu_count"),
    ("/v1/requests", REQUEST % '"settings": {"cpu_count": N}', "0." + "0" * 3000 + "1",
     "settings.cpu_count"),
    ("/v1/requests", REQUEST % '"settings": {"gpu_count": N}', HUGE, "settings.gpu_count"),
    ("/v1/requests", REQUEST % '"settings": {"memory": "NMB"}', str(2**63 - 1), "settings.memory"),
    ("/v1/requests", REQUEST % '"settings": {"memory": "NPB"}', DIGITS, "settings.memory"),
    ("/v1/requests", REQUEST % '"settings": {"memory": "NMB"}', "1." + "0" * 20000 + "1",
     "settings.memory"),
    ("/v1/requests", REQUEST % '"lease_seconds": N', "1e400", "lease_seconds"),
    ("/v1/requests", REQUEST % '"lease_seconds": N', "-0", "lease_seconds"),
    ("/v1/requests", REQUEST % '"max_retries": N', HUGE, "max_retries"),
    ("/v1/requests/batch", MEMBER % '"resources": {"gpu": N}', HUGE, "members[2].resources.gpu"),
    ("/v1/requests/batch", MEMBER % '"resources": {"gpu": N}', "1e400",
     "members[2].resources.gpu"),
    ("/v1/requests/batch", MEMBER % '"settings": {"cpu_count": N}', "1e400",
     "members[2].settings.cpu_count"),
]  # fmt: skip


async def queued_memory(c: httpx.AsyncClient) -> list[float]:
    """/metrics (with the database up): the queued demand of memory_mb, per pool."""
    metrics = (await c.get("/metrics")).text
    assert "respool_database_up 1" in metrics
    return [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("respool_pool_queued_demand{") and 'key="memory_mb"' in line
    ]


@pytest.mark.parametrize(("path", "body", "number", "field"), CASES, ids=[c[3] for c in CASES])
async def test_extreme_numbers_name_their_field(
    module_server: Server, path: str, body: str, number: str, field: str
) -> None:
    c = module_server.client
    if not ok(await c.get("/v1/pools")):
        ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 8}}), 201)
        ok(await c.post("/v1/policies", json={"subject": "team", "pool": "p"}), 201)
    sent = body.replace("N", number).encode()
    answer = error(await c.post(path, content=sent, headers=JSON), 400, field)
    detail = answer["detail"]
    assert detail.startswith(field.split("[")[0]) or field in detail, detail
    for jargon in ("range - at", "$[", "overflows numeric", "bigint out of range"):
        assert jargon not in detail, detail
    assert len(detail) < 300, detail
    # nothing was created
    assert [p["name"] for p in ok(await c.get("/v1/pools"))] == ["p"]
    assert len(ok(await c.get("/v1/policies"))) == 1
    assert ok(await c.get("/v1/requests"))["items"] == []


async def test_the_largest_amounts_keep_views_dashboard_and_metrics_working(
    server: Server,
) -> None:
    """Amounts of an untracked key at the bound, held and queued by several subjects: every
    other create still works, and usage, the dashboard and the metrics add them up."""
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
    for team in ("a", "b", "c"):
        ok(await c.post("/v1/policies", json={"subject": team, "pool": "p"}), 201)
    big = {"gpu": 1, "memory_mb": MAX_AMOUNT}
    first = ok(await c.post("/v1/requests", json={"subject": "a", "resources": big}), 201)
    assert first["status"] == "allocated"
    for team in ("a", "b"):  # two queued behind the gpu: the queued demand is 2 * MAX_AMOUNT
        queued = ok(await c.post("/v1/requests", json={"subject": team, "resources": big}), 201)
        assert queued["status"] == "queued"
    small = ok(
        await c.post("/v1/requests", json={"subject": "c", "resources": {"memory_mb": 10}}), 201
    )
    assert small["status"] == "allocated"
    pool = ok(await c.get("/v1/pools/p"))
    assert pool["usage"]["memory_mb"] == MAX_AMOUNT + 10
    dashboard = ok(await c.get("/v1/dashboard"))
    assert "p" in str(dashboard)
    demand = await queued_memory(c)
    assert demand == [2.0 * MAX_AMOUNT], demand


async def test_queued_amounts_beyond_int64_in_total_keep_reads_working(
    server: Server, db_url: str
) -> None:
    """Rows stored before amounts were bounded (a database upgraded from a version that took
    2^63-1) sum beyond int64: the views, the dashboard and the metrics still add them up."""
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
    ok(await c.post("/v1/policies", json={"subject": "a", "pool": "p"}), 201)
    held = ok(await c.post("/v1/requests", json={"subject": "a", "resources": {"gpu": 1}}), 201)
    assert held["status"] == "allocated"
    for _ in range(2):
        body = {"subject": "a", "resources": {"gpu": 1, "memory_mb": 1}}
        assert ok(await c.post("/v1/requests", json=body), 201)["status"] == "queued"
    async with direct(db_url) as conn:
        await conn.execute(
            "UPDATE respool.queue_entries SET resources = resources || $1::text::jsonb",
            '{"memory_mb": 9223372036854775807}',
        )
        demand = await conn.fetchval(
            "SELECT queued_demand FROM respool.pool_usage WHERE key = 'memory_mb'"
        )
        assert demand == 2 * (2**63 - 1)
    assert ok(await c.get("/v1/dashboard"))
    assert await queued_memory(c) == [2.0 * (2**63 - 1)]
