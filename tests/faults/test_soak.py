"""Row 9: soak, 30 minutes in long mode (40 s in short mode), of mixed traffic against a real
``respool serve`` process: preemptible and non-preemptible requests, reserved shares and
priorities (reclaim and priority preemption, requeues), short leases with a share of grants
abandoned (lease expiry), long-polls, heartbeats.

* invariant violations: 0; no 500, no hang;
* flat memory: the server's RSS at the end is within 10 % of its RSS after warm-up;
* no growth in open connections (pg_stat_activity of its database) nor file descriptors.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from pathlib import Path

import asyncpg
import httpx
import pytest

from faults.traffic import Profile, Traffic
from support.db import connections_by_app, direct
from support.faults import Auditor, pick, record
from support.server import ServeProcess

pytestmark = pytest.mark.faults

RSS_DRIFT = 0.10


async def _connections(conn: asyncpg.Connection) -> Counter[str]:
    """The service's connections (application_name respool-*), the auditor's excluded."""
    found = await connections_by_app(conn)
    return Counter(
        {
            app: n
            for app, n in found.items()
            if app.startswith("respool-") and app != "respool-auditor"
        }
    )


async def test_soak_mixed_traffic(db_url: str, tmp_path: Path) -> None:
    seconds = pick(40.0, 1800.0)
    warmup = pick(12.0, 120.0)
    window = pick(6.0, 60.0)  # RSS and connections: medians over a window after warm-up / at end
    server = ServeProcess(
        db_url,
        tmp_path,
        RESPOOL_RECONCILE_INTERVAL="0.5",
        RESPOOL_DB_POOL_SIZE="6",
        RESPOOL_MAX_WAIT="5",
    )
    server.start()
    samples: list[tuple[float, int, int, int]] = []  # (t, rss, fds, connections)
    try:
        await server.ready()
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            for name, gpus in (("p", 8), ("q", 4)):
                r = await c.post("/v1/pools", json={"name": name, "capacity": {"gpu": gpus}})
                assert r.status_code == 201, r.text
            for subject, pool, priority, reserved in (
                ("prod", "p", 2, {"gpu": 4}),
                ("dev", "p", 0, {}),
                ("batch", "p", 1, {"gpu": 1}),
                ("prod", "q", 2, {"gpu": 2}),
                ("dev", "q", 0, {}),
            ):
                body = {"subject": subject, "pool": pool, "priority": priority}
                r = await c.post("/v1/policies", json={**body, "reserved": reserved})
                assert r.status_code == 201, r.text
        traffic = Traffic(
            server.url,
            Profile(
                subjects=(("prod", 0.3, 1), ("dev", 1.0, 2), ("batch", 0.8, 1)),
                gpus=(1, 1, 2),
                hold=(0.0, 2.0),
                lease_seconds=3,
                abandon=0.1,
                wait=3.0,
            ),
            workers=10,
            seed=9,
        )
        async with Auditor(db_url, interval=0.5) as auditor, direct(db_url) as conn:
            run = asyncio.create_task(traffic.run_until_stopped())
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                await asyncio.sleep(1.0)
                conns = sum((await _connections(conn)).values())
                samples.append(
                    (time.monotonic() - start, server.rss_bytes(), server.open_fds(), conns)
                )
            traffic.stop.set()
            await asyncio.wait_for(run, 120)
            expired = await conn.fetchval(
                "SELECT count(*) FROM respool.requests WHERE status = 'expired'"
            )
            preempted = await conn.fetchval(
                "SELECT count(*) FROM respool.request_events WHERE to_status = 'preempted'"
            )
    finally:
        server.close()

    def median(index: int, lo: float, hi: float) -> float:
        return statistics.median(s[index] for s in samples if lo <= s[0] < hi)

    base_rss = median(1, warmup, warmup + window)
    end_rss = median(1, seconds - window, seconds + 1)
    drift = (end_rss - base_rss) / base_rss
    base_fds, end_fds = median(2, warmup, warmup + window), median(2, seconds - window, seconds + 1)
    base_conns = max(s[3] for s in samples if warmup <= s[0] < warmup + window)
    end_conns = max(s[3] for s in samples if s[0] >= seconds - window)
    figures = {
        "seconds": seconds,
        **traffic.summary(),
        "expired": expired,
        "preemptions": preempted,
        "abandoned": traffic.tally["abandoned"],
        "rss_mb_after_warmup": round(base_rss / 2**20, 1),
        "rss_mb_end": round(end_rss / 2**20, 1),
        "rss_drift_pct": round(100 * drift, 1),
        "fds_after_warmup": base_fds,
        "fds_end": end_fds,
        "db_connections_after_warmup": base_conns,
        "db_connections_end": end_conns,
        "db_connections_max": max(s[3] for s in samples),
        "auditor_snapshots": auditor.snapshots,
        "violations": len(auditor.violations),
    }
    record("row9 soak (mixed traffic, preemption, lease expiry)", **figures)
    assert auditor.violations == [], auditor.violations[:10]
    assert traffic.anomalies == [], traffic.anomalies[:10]
    assert expired > 0 and preempted > 0  # both kinds of churn happened
    assert drift <= RSS_DRIFT, figures
    assert end_conns <= max(base_conns, 8), figures  # pool (6) + listener + reconciler
    assert end_fds <= base_fds + 10, figures
