"""Row 2: ``pg_terminate_backend`` on random API, reconciler and listener connections every
1-5 s, under traffic with preemption (mixed preemptible / non-preemptible, reserved shares,
requeues).

* invariant violations (auditor, every 200 ms): 0;
* no 500, no hang: a killed API connection answers 503 with ``Retry-After`` and is retried;
* the listener recovers after every kill (reconnects == listener kills) and the reconciler keeps
  running passes after every kill of its connection;
* after every kill, a wake still arrives: a long-poll on a queued request is answered
  ``allocated`` when its blocker is released, and the notification for it reached the listener;
* acknowledged grants and releases lost: 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest

from app.db.connect import APP_API, APP_LISTENER, APP_RECONCILER
from app.reconciler import Reconciler
from faults.traffic import (
    CONTENDED,
    Traffic,
    assert_nothing_lost,
    audit_figures,
    lost_acknowledgements,
)
from support.db import direct
from support.faults import Auditor, pick, record
from support.http import ok
from support.server import Server, running_server
from support.wait import wait_until

pytestmark = pytest.mark.faults

KINDS = (APP_API, APP_RECONCILER, APP_LISTENER)


class WakeProbe:
    """A pool of one GPU with one holder and one waiter: ``check`` long-polls the waiter,
    releases the holder, and expects the waiter's answer ``allocated`` via a notification."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.notified: set[UUID] = set()
        self.holder = ""
        self.latencies: list[float] = []
        self.retried_polls = 0
        server.notifier.observe(self._seen)

    def _seen(self, _pid: int, payload: str) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self.notified.add(UUID(json.loads(payload)["id"]))

    async def setup(self) -> None:
        c = self.server.client
        ok(await c.post("/v1/pools", json={"name": "wake", "capacity": {"gpu": 1}}), 201)
        ok(await c.post("/v1/policies", json={"subject": "probe", "pool": "wake"}), 201)
        self.holder = (await self._create())["id"]

    async def _create(self) -> dict[str, Any]:
        body = {"subject": "probe", "pool": "wake", "resources": {"gpu": 1}}
        for _ in range(50):  # bounded: a killed API connection answers 503 once
            r = await self.server.client.post("/v1/requests", json=body)
            if r.status_code != 503:
                got: dict[str, Any] = ok(r, 201)
                return got
            await asyncio.sleep(0.1)
        raise AssertionError("create kept failing")

    async def _post(self, path: str) -> None:
        for _ in range(50):
            r = await self.server.client.post(path)
            if r.status_code != 503:
                ok(r)
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{path} kept failing")

    async def check(self) -> None:
        c = self.server.client
        waiter = await self._create()
        assert waiter["status"] == "queued", waiter
        wid = UUID(waiter["id"])

        async def long_poll() -> Any:
            for _ in range(50):  # a killed API connection answers 503: poll again
                r = await c.get(
                    f"/v1/requests/{wid}", params={"wait": 10, "version": waiter["version"]}
                )
                if r.status_code != 503:
                    return r
                self.retried_polls += 1
                await asyncio.sleep(0.1)
            raise AssertionError("the probe's long-poll kept failing")

        poll = asyncio.create_task(long_poll())

        async def registered() -> bool:
            return wid in self.server.notifier._waiters

        await wait_until(registered, "the probe's long-poll", within=10)
        await self._post(f"/v1/requests/{self.holder}/release")
        released = time.monotonic()
        r = await asyncio.wait_for(poll, 15)
        self.latencies.append(time.monotonic() - released)
        assert r.status_code == 200 and r.json()["status"] == "allocated", r.text
        assert wid in self.notified, "the wake did not come through the listener"
        self.holder = str(wid)


async def _terminate(conn: Any, kind: str) -> int:
    pid = await conn.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = $1 AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1",
        kind,
    )
    if pid is None:
        return 0
    return 1 if await conn.fetchval("SELECT pg_terminate_backend($1)", pid) else 0


async def test_backend_kills_under_traffic(db_url: str) -> None:
    seconds = pick(30.0, 240.0)
    kills: Counter[str] = Counter()
    recovered: Counter[str] = Counter()
    listener_back: list[float] = []
    async with running_server(
        db_url, with_reconciler=True, reconcile_interval=0.3, db_pool_size=4, max_wait=5
    ) as server:
        c = server.client
        ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 6}}), 201)
        for subject, priority, reserved in (("a", 1, {"gpu": 3}), ("b", 0, {}), ("c", 2, {})):
            body = {"subject": subject, "pool": "p", "priority": priority, "reserved": reserved}
            ok(await c.post("/v1/policies", json=body), 201)
        probe = WakeProbe(server)
        await probe.setup()
        reconciler: Reconciler = server.app.state.reconciler
        traffic = Traffic(
            server.url,
            replace(CONTENDED, subjects=(*CONTENDED.subjects, ("c", 1.0, 0)), hold=(0.0, 0.5)),
            workers=8,
            seed=2,
        )
        rng = random.Random(11)
        async with Auditor(db_url) as auditor, direct(db_url) as admin:
            run = asyncio.create_task(traffic.run_until_stopped())
            end = time.monotonic() + seconds
            order: list[str] = []
            while time.monotonic() < end:
                await asyncio.sleep(rng.uniform(1.0, 5.0))
                if not order:
                    order = list(KINDS)
                    rng.shuffle(order)
                kind = order.pop()
                reconnects, passes = server.notifier.reconnects, reconciler.passes
                if not await _terminate(admin, kind):
                    continue
                kills[kind] += 1
                if kind == APP_LISTENER:

                    async def relistening(before: int = reconnects) -> bool:
                        return server.notifier.reconnects > before and server.notifier.healthy

                    listener_back.append(await wait_until(relistening, "the listener", within=30))
                    recovered[kind] += 1
                elif kind == APP_RECONCILER:

                    async def reconciling(before: int = passes) -> bool:
                        return reconciler.passes > before + 2

                    await wait_until(reconciling, "reconciler passes", within=30)
                    recovered[kind] += 1
                await probe.check()  # a wake after the kill still arrives
            traffic.stop.set()
            await asyncio.wait_for(run, 120)
        async with direct(db_url) as conn:
            lost_grants, lost_releases = await lost_acknowledgements(
                conn, traffic.acked_grants, traffic.acked_releases
            )
    figures = {
        "seconds": seconds,
        "kills": dict(kills),
        "listener_reconnects": server.notifier.reconnects,
        "listener_back_s_max": round(max(listener_back, default=0.0), 2),
        "wakes_after_kill": len(probe.latencies),
        "wake_latency_ms_max": round(max(probe.latencies, default=0.0) * 1000),
        **traffic.summary(),
        "preempted_or_fenced": traffic.tally["release_fenced"] + traffic.tally["ended_preempted"],
        **audit_figures(auditor, lost_grants, lost_releases),
    }
    record("row2 backend kills (pg_terminate_backend every 1-5 s)", **figures)
    assert_nothing_lost(auditor, traffic, lost_grants, lost_releases)
    assert set(kills) == set(KINDS), kills  # each kind killed at least once
    assert server.notifier.reconnects == kills[APP_LISTENER]
    assert recovered[APP_LISTENER] == kills[APP_LISTENER]
    assert recovered[APP_RECONCILER] == kills[APP_RECONCILER]
    assert len(probe.latencies) == sum(kills.values())


async def test_bursts_of_api_connection_kills(db_url: str) -> None:
    """Every API connection terminated at once, 15 times (100 in long mode), while 4 clients
    create and release: no 500 (a pooled connection killed while idle is skipped, one killed
    mid-statement answers 503 with ``Retry-After``), and the API serves on."""
    rounds = pick(15, 100)
    codes: Counter[str] = Counter()
    async with running_server(db_url, db_pool_size=4) as server:
        c = server.client
        ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1000}}), 201)
        ok(await c.post("/v1/policies", json={"subject": "s", "pool": "p"}), 201)

        async def hammer(n: int) -> None:
            for _ in range(n):
                r = await c.post("/v1/requests", json={"subject": "s", "resources": {"gpu": 1}})
                codes[str(r.status_code)] += 1
                if r.status_code == 503 and r.headers.get("retry-after"):
                    codes["503_with_retry_after"] += 1
                if r.status_code == 201:
                    rid = r.json()["id"]
                    r = await c.post(f"/v1/requests/{rid}/release")
                    codes[str(r.status_code)] += 1
                    if r.status_code == 503 and r.headers.get("retry-after"):
                        codes["503_with_retry_after"] += 1

        async with Auditor(db_url) as auditor, direct(db_url) as admin:
            killed = 0
            for _ in range(rounds):
                tasks = [asyncio.create_task(hammer(10)) for _ in range(4)]
                await asyncio.sleep(0.05)
                killed += await admin.fetchval(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                    " FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = $1",
                    APP_API,
                )
                await asyncio.wait_for(asyncio.gather(*tasks), 60)
            ok(await c.get("/v1/pools"))
    record(
        "row2b bursts of API connection kills",
        rounds=rounds,
        backends_killed=killed,
        http=dict(sorted(codes.items())),
        violations=len(auditor.violations),
    )
    assert auditor.violations == []
    assert set(codes) <= {"200", "201", "503", "503_with_retry_after"}, codes
    assert codes["503"] == codes["503_with_retry_after"]
    assert codes["201"] > 0 and killed >= rounds
