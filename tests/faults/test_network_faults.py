"""Row 6: network faults between the API and PostgreSQL, through tests/faults/proxy.py.

The API (with its reconciler and listener) reaches the test's own PostgreSQL only through the
proxy; the auditor and the test's checks connect directly. Under client traffic the proxy goes
through: pass -> latency 50 ms -> pass -> blackhole (longer than the pool's acquire timeout) ->
pass -> reset (every connection aborted with RST) -> pass.

* invariant violations: 0; acknowledged grants and releases lost: 0;
* no 500 and no hang: while PostgreSQL is unreachable the API answers 503 with ``Retry-After``
  within its bounds (acquire 10 s, statement 30 s; app/db/connect.py);
* recovery after restore: the API serves again (GET and POST 2xx) and the listener is back
  (measured; asserted under a generous bound).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.db.connect import ACQUIRE_TIMEOUT
from faults.pg import PgCluster
from faults.proxy import FaultProxy
from faults.traffic import (
    assert_nothing_lost,
    audit_figures,
    contended_traffic,
    listener_back,
    lost_acknowledgements,
)
from support.db import direct
from support.faults import Auditor, pick, record
from support.http import serves_again
from support.server import running_server
from support.wait import wait_until

pytestmark = pytest.mark.faults

RECOVERY_BOUND = 20.0  # seconds after the network is restored (measured values: far below)


async def test_network_faults_between_api_and_postgres(cluster: PgCluster, cluster_db: str) -> None:
    rounds = pick(1, 3)
    steady = pick(3.0, 20.0)
    blackhole = pick(ACQUIRE_TIMEOUT + 2, 45.0)  # long mode: beyond the statement timeout too
    proxy = FaultProxy(cluster.port)
    await proxy.start()
    through_proxy = f"postgresql://postgres@127.0.0.1:{proxy.port}/respool"
    phases: list[dict[str, Any]] = []
    try:
        async with running_server(
            through_proxy, with_reconciler=True, reconcile_interval=0.5, db_pool_size=6
        ) as server:
            c = server.client
            traffic = await contended_traffic(server, workers=8, seed=6)

            async def restore(fault: str, started: float) -> None:
                proxy.set_mode("pass")
                restored = time.monotonic()
                serving = await wait_until(lambda: serves_again(c), "the API", within=60)
                listener = await listener_back(server)
                phases.append(
                    {
                        "fault": fault,
                        "lasted_s": round(restored - started, 1),
                        "serves_again_s": round(serving, 2),
                        "listener_up_s": round(listener, 2),
                    }
                )

            async with Auditor(cluster_db) as auditor:
                run = asyncio.create_task(traffic.run_until_stopped())
                for _ in range(rounds):
                    await asyncio.sleep(steady)
                    started = time.monotonic()
                    proxy.set_mode("latency", latency_ms=50)
                    await asyncio.sleep(steady)
                    await restore("latency 50 ms", started)
                    await asyncio.sleep(steady)
                    started = time.monotonic()
                    proxy.set_mode("blackhole")
                    await asyncio.sleep(blackhole)
                    await restore("blackhole", started)
                    await asyncio.sleep(steady)
                    started = time.monotonic()
                    proxy.set_mode("reset")
                    await asyncio.sleep(1.0)
                    await restore("reset", started)
                await asyncio.sleep(steady)
                traffic.stop.set()
                await asyncio.wait_for(run, 180)
    finally:
        await proxy.close()

    async with direct(cluster_db) as conn:
        lost_grants, lost_releases = await lost_acknowledgements(
            conn, traffic.acked_grants, traffic.acked_releases
        )
    transport_errors = {k: v for k, v in traffic.codes.items() if not k.isdigit()}
    figures = {
        "rounds": rounds,
        "blackhole_s": blackhole,
        "phases": phases,
        **traffic.summary(),
        "proxy_connections": proxy.connections,
        "proxy_resets": proxy.resets,
        **audit_figures(auditor, lost_grants, lost_releases),
    }
    record("row6 network faults API<->PostgreSQL (proxy)", **figures)
    assert_nothing_lost(auditor, traffic, lost_grants, lost_releases)
    assert transport_errors == {}, transport_errors
    assert traffic.codes["503"] > 0  # the faults were felt ...
    assert all(p["serves_again_s"] < RECOVERY_BOUND for p in phases), phases  # ... and healed
    assert proxy.resets > 0
