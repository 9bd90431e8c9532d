"""300 concurrent long-polls on one server process with a pool of 5 database connections.

While they all wait, the test database sees no more than the pool, the one LISTEN connection
(and a reconciler connection, when one runs); the server still answers other calls. Freeing
capacity for k requests answers exactly the k waiters at the head of the queue; the others
keep waiting, and shutdown answers them with their current (queued) state.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

import asyncpg
import httpx
import pytest

from app.db.connect import APP_API, APP_LISTENER, APP_RECONCILER
from support.db import connections_by_app
from support.http import get_request, ok, pool_with_policy
from support.server import running_server
from support.wait import wait_until

pytestmark = pytest.mark.slow  # measured: tens of seconds (pytest --durations)

POOL_SIZE = 5
GET_WAITERS = 200  # created first, in order: the head of the queue
POST_WAITERS = 100  # POST /v1/requests?wait=, created concurrently behind them
WAIT = 25  # seconds; never reached: the test ends every wait itself
MONITOR = "respool-test-monitor"


async def test_300_long_polls_share_five_connections_and_wake_in_queue_order(db_url: str) -> None:
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        async with running_server(db_url, db_pool_size=POOL_SIZE, max_wait=WAIT) as srv:
            c = srv.client
            await pool_with_policy(c, capacity={"gpu": 1})
            holder = ok(
                await c.post("/v1/requests", json={"subject": "team", "resources": {"gpu": 1}}),
                201,
            )
            assert holder["status"] == "allocated"
            queued = []
            for _ in range(GET_WAITERS):
                r = ok(
                    await c.post("/v1/requests", json={"subject": "team", "resources": {"gpu": 1}}),
                    201,
                )
                queued.append(r)
            assert [r["queue_position"] for r in queued] == list(range(1, GET_WAITERS + 1))

            base = srv.url
            gets = {
                r["id"]: asyncio.create_task(
                    http.get(f"{base}/v1/requests/{r['id']}", params={"wait": WAIT})
                )
                for r in queued
            }
            posts = [
                asyncio.create_task(
                    http.post(
                        f"{base}/v1/requests",
                        params={"wait": WAIT},
                        json={"subject": "team", "resources": {"gpu": 1}},
                    )
                )
                for _ in range(POST_WAITERS)
            ]
            total = GET_WAITERS + POST_WAITERS
            await wait_until(
                lambda: srv.notifier.waiting == total, f"{total} waiters", within=15, step=0.01
            )

            monitor = await asyncpg.connect(
                srv.db_url, server_settings={"application_name": MONITOR}
            )
            try:
                # All 300 wait: sample the database's connections a few times.
                seen: Counter[str] = Counter()
                for _ in range(5):
                    now = await connections_by_app(monitor)
                    for name, n in now.items():
                        seen[name] = max(seen[name], n)
                    # The server answers other calls meanwhile (waiters hold no connection).
                    pools = ok(await c.get("/v1/pools"))
                    assert pools[0]["queued"] == total
                    await asyncio.sleep(0.1)
                assert srv.notifier.waiting == total
                print(f"\n[scale] connections while {total} waited: {dict(seen)}", file=sys.stderr)
                allowed = POOL_SIZE + 1 + min(seen[APP_RECONCILER], 1)
                assert sum(seen.values()) <= allowed, seen
                assert 1 <= seen[APP_API] <= POOL_SIZE, seen
                assert seen[APP_LISTENER] == 1, seen
                assert set(seen) <= {APP_API, APP_LISTENER, APP_RECONCILER}, seen
            finally:
                await monitor.close()
            assert not any(t.done() for t in [*gets.values(), *posts])

            # k = 1: the holder releases; only the head of the queue is answered.
            ok(await c.post(f"/v1/requests/{holder['id']}/release"))
            head = queued[0]["id"]
            answer = await asyncio.wait_for(gets[head], 10)
            assert ok(answer)["status"] == "allocated"
            await asyncio.sleep(0.3)  # a wrongly woken waiter would answer now
            pending = [rid for rid, t in gets.items() if not t.done()]
            assert pending == [r["id"] for r in queued[1:]]
            assert not any(t.done() for t in posts)

            # k = 3: capacity grows from 1 to 4; the next three in the queue are answered.
            ok(await c.patch("/v1/pools/p", json={"capacity": {"gpu": 4}}))
            nxt = [r["id"] for r in queued[1:4]]
            answers = await asyncio.wait_for(asyncio.gather(*(gets[i] for i in nxt)), 10)
            assert [ok(a)["status"] for a in answers] == ["allocated"] * 3
            await asyncio.sleep(0.3)
            pending = [rid for rid, t in gets.items() if not t.done()]
            assert pending == [r["id"] for r in queued[4:]]
            assert not any(t.done() for t in posts)
            assert srv.notifier.waiting == total - 4
            for rid in (pending[0], pending[-1]):
                assert (await get_request(srv.client, rid))["status"] == "queued"
            allocated = ok(await c.get("/v1/requests", params={"status": "allocated"}))["items"]
            assert {r["id"] for r in allocated} == {queued[i]["id"] for i in range(4)}
        # Leaving the block shut the server down: every open wait was answered, still queued.
        rest = await asyncio.wait_for(asyncio.gather(*(gets[i] for i in pending), *posts), 15)
    assert [r.status_code for r in rest] == [200] * len(pending) + [201] * POST_WAITERS
    assert {r.json()["status"] for r in rest} == {"queued"}
