"""An outage of respool itself must not expire healthy holders.

Five holders heartbeat every second with a 5 s lease; the API (with its reconciler) is SIGKILLed
and stays down 8 s, longer than the lease. After the restart every holder's first heartbeat must
find its request still ``allocated`` (docs/preemption.md, "Outages": the first liveness record
after the gap gives every lease the gap back). The SQL test pins the mechanism itself: a stale
liveness record stops expiry, and ``respool.service_alive`` extends each lease by the gap once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from support.db import direct
from support.faults import pick, record
from support.server import ServeProcess

pytestmark = pytest.mark.faults

HOLDERS = 5
LEASE = 5


async def _heartbeat(client: httpx.AsyncClient, rid: str) -> dict[str, Any] | None:
    """One heartbeat; None while the API is down (connection refused, 503)."""
    try:
        r = await client.post(f"/v1/requests/{rid}/heartbeat", params={"attempt": 1}, timeout=5)
    except httpx.TransportError:
        return None
    if r.status_code == 503:
        return None
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


async def test_api_outage_longer_than_the_lease_expires_no_holder(
    db_url: str, tmp_path: Path
) -> None:
    down = pick(8.0, 20.0)
    server = ServeProcess(db_url, tmp_path, RESPOOL_RECONCILE_INTERVAL="0.2")
    server.start()
    try:
        await server.ready()
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
            r = await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": HOLDERS}})
            assert r.status_code == 201, r.text
            r = await c.post("/v1/policies", json={"subject": "s", "pool": "p"})
            assert r.status_code == 201, r.text
            ids = []
            for _ in range(HOLDERS):
                body: dict[str, Any] = {"subject": "s", "pool": "p", "resources": {"gpu": 1}}
                body["lease_seconds"] = LEASE
                r = await c.post("/v1/requests", params={"wait": 5}, json=body)
                assert r.status_code == 201 and r.json()["status"] == "allocated", r.text
                ids.append(r.json()["id"])
            first_after: dict[str, str] = {}
            killed = asyncio.Event()

            async def holder(rid: str) -> None:
                while rid not in first_after:
                    doc = await _heartbeat(c, rid)
                    if doc is not None:
                        assert doc["status"] == "allocated", doc  # healthy before the outage
                        if killed.is_set():
                            first_after[rid] = doc["status"]
                    await asyncio.sleep(1.0)

            tasks = [asyncio.create_task(holder(rid)) for rid in ids]
            await asyncio.sleep(3.0)
            server.kill()
            killed.set()
            t_down = time.monotonic()
            await asyncio.sleep(down)
            server.start()
            await server.ready()
            downtime = time.monotonic() - t_down
            done, _ = await asyncio.wait(tasks, timeout=30)
            for t in done:
                t.result()  # a holder that saw `expired` fails here, naming the request
            assert len(done) == HOLDERS, "a holder got no heartbeat through after the restart"
        async with direct(db_url) as conn:
            statuses = sorted(
                r["status"]
                for r in await conn.fetch(
                    "SELECT status FROM respool.requests WHERE id = ANY($1::uuid[])", ids
                )
            )
    finally:
        server.close()
    record(
        "outage: API down longer than the lease",
        holders=HOLDERS,
        lease_s=LEASE,
        down_s=round(downtime, 1),
        first_heartbeat_after=sorted(first_after.values()),
        final=statuses,
    )
    assert sorted(first_after.values()) == ["allocated"] * HOLDERS
    assert statuses == ["allocated"] * HOLDERS
    assert "extended by it" in server.log(), server.log()


async def test_stale_liveness_stops_expiry_and_gives_the_gap_back(conn: asyncpg.Connection) -> None:
    """SQL level, no timing: liveness 60 s old = an outage of 60 s."""
    await conn.execute("SELECT respool.create_pool(p_name => 'q', p_capacity => '{\"gpu\": 2}')")
    await conn.execute("SELECT respool.create_policy(p_subject => 's', p_pool => 'q')")
    await conn.execute(
        'SELECT respool.create_request(\'{"subject": "s", "pool": "q",'
        ' "resources": {"gpu": 1}, "lease_seconds": 5}\')'
    )
    rid = await conn.fetchval("SELECT id FROM respool.requests WHERE status = 'allocated'")
    pool_id = await conn.fetchval("SELECT id FROM respool.pools WHERE name = 'q'")
    await conn.fetchval("SELECT respool.reconcile_pool($1)", pool_id)
    # The lease lapsed 30 s ago, during an outage that began 60 s ago.
    await conn.execute(
        "UPDATE respool.requests SET lease_expires_at = now() - interval '30 seconds'"
        " WHERE id = $1",
        rid,
    )
    await conn.execute(
        "INSERT INTO respool.service_heartbeat VALUES (true, now() - interval '60 seconds')"
    )
    assert await conn.fetchval("SELECT respool.leases_may_lapse()") is False
    doc = await conn.fetchval("SELECT respool.reconcile_pool($1)", pool_id)
    assert doc["expired"] == 0  # the service looks down: nothing lapses
    gone = await conn.fetchval("SELECT respool.heartbeat_request($1)", rid)
    assert gone["status"] == "allocated"  # a heartbeat then revives it instead of expiring it
    await conn.execute(
        "UPDATE respool.requests SET lease_expires_at = now() - interval '30 seconds'"
        " WHERE id = $1",
        rid,
    )
    back = await conn.fetchval("SELECT respool.service_alive()")
    assert back["leases"] == 1 and back["gap_seconds"] == pytest.approx(60, abs=1)
    expires = await conn.fetchval(
        "SELECT lease_expires_at - now() FROM respool.requests WHERE id = $1", rid
    )
    assert expires.total_seconds() == pytest.approx(30, abs=1)  # -30 s + the 60 s gap
    again = await conn.fetchval("SELECT respool.service_alive()")
    assert again["leases"] == 0  # the gap is given back once
    assert await conn.fetchval("SELECT respool.leases_may_lapse()") is True
    doc = await conn.fetchval("SELECT respool.reconcile_pool($1)", pool_id)
    assert doc["expired"] == 0
