"""respool through a failover of a real HA cluster (Patroni + etcd, two PostgreSQL 15
nodes on loopback, synchronous replication on; tests/faults/patroni.py).

``respool serve`` (API + reconciler) gets the multi-host DSN with
``target_session_attrs=read-write``; 8 client workers run under load (create with idempotency
keys, long-polls, holds, releases, preemptions in a contended pool) and an invariant auditor
reads the primary. Then ``patronictl switchover`` and, separately, ``kill -9`` of the primary's
postmaster. Asserted: acknowledged grants and releases lost = 0, duplicates = 0, every call and
long-poll answered (no 500, no 503 without Retry-After, no hang), invariants clean on the new
primary, /readyz names the node that serves. Reported: the seconds from the promotion (the new
primary accepts writes) until the API answers writes again.

Skipped when Patroni, etcd or PostgreSQL 15 are not installed (tests/faults/install-ha.sh).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.db.connect import APP_CLI, connect
from app.db.dsn import with_database
from app.db.migrate import migrate
from app.db.named import query
from faults.patroni import PatroniCluster, missing
from faults.traffic import CONTENDED, Traffic, duplicated_keys, lost_acknowledgements
from support.db import direct
from support.faults import Auditor, pick, record
from support.http import contended_pool, serves_again
from support.server import ServeProcess
from support.wait import wait_until

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(missing() is not None, reason=str(missing())),
]


@pytest.fixture
def ha() -> Iterator[PatroniCluster]:
    cluster = PatroniCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


async def _promoted(ha: PatroniCluster, old: str, since: datetime) -> str | None:
    """The node that accepts writes after the fault: another node, or ``old`` restarted after
    ``since`` (Patroni restarts a crashed primary in place while it holds the leader key)."""
    for node in ha.NODES:
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn = await connect(
                ha.node_dsn(node, "postgres"), application_name=APP_CLI, connect_timeout=1
            )
            try:
                row = await conn.fetchrow(query("server_role"))
            finally:
                conn.terminate()
            if row is not None and not row["standby"] and (node != old or row["started"] > since):
                return node
    return None


async def _fault(ha: PatroniCluster, kind: str, client: httpx.AsyncClient) -> dict[str, Any]:
    old = ha.leader()
    assert old is not None
    since = datetime.now(UTC)
    t0 = time.monotonic()
    if kind == "switchover":
        candidate = next(n for n in ha.NODES if n != old)
        await asyncio.to_thread(ha.switchover, candidate)
    else:
        ha.kill_postmaster(old)
    new: list[str] = []

    async def promoted() -> bool:
        node = await _promoted(ha, old, since)
        if node is not None:
            new.append(node)
        return node is not None

    promotion = await wait_until(promoted, "a primary after the fault", within=120, step=0.05)
    t_promoted = t0 + promotion
    await wait_until(lambda: serves_again(client), "the API to write again", within=120)
    writes_again = time.monotonic() - t_promoted
    # Ready again, on the new primary (readyz names it), with a synchronous standby for the
    # next fault.
    await asyncio.to_thread(
        ha.wait_for,
        lambda: ha.leader() == new[0] and ha.sync_standby() is not None,
        "the cluster to settle",
        120,
    )

    async def ready_on_new() -> bool:
        r = await client.get("/readyz", timeout=5)
        node = r.json().get("node") or ""
        return r.status_code == 200 and node.endswith(f":{ha.pg_ports[new[0]]}")

    await wait_until(ready_on_new, "/readyz to name the new primary", within=60)
    return {
        "fault": kind,
        "old_primary": old,
        "new_primary": new[0],
        "promotion_s": round(promotion, 2),
        "writes_again_after_promotion_s": round(writes_again, 2),
    }


async def test_failover_under_load(ha: PatroniCluster, tmp_path: Path) -> None:
    warm = pick(4.0, 20.0)
    admin = await asyncpg.connect(with_database(ha.dsn, "postgres"), timeout=30)
    try:
        await admin.execute('CREATE DATABASE "respool"')
    finally:
        await admin.close()
    async with direct(ha.dsn) as conn:
        await migrate(conn)

    server = ServeProcess(
        ha.dsn, tmp_path, RESPOOL_RECONCILE_INTERVAL="0.5", RESPOOL_DB_POOL_SIZE="6"
    )
    server.start()
    faults: list[dict[str, Any]] = []
    try:
        await server.ready(within=60)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            await contended_pool(c)
            traffic = Traffic(
                server.url,
                CONTENDED,
                workers=8,
            )
            async with Auditor(ha.dsn) as auditor:
                run = asyncio.create_task(traffic.run_until_stopped())
                for kind in ("switchover", "kill -9 postmaster"):
                    await asyncio.sleep(warm)
                    assert traffic.last_ok > time.monotonic() - 3, "no traffic before the fault"
                    faults.append(await _fault(ha, kind, c))
                await asyncio.sleep(warm)
                traffic.stop.set()
                await asyncio.wait_for(run, 120)
                readyz = (await c.get("/readyz")).json()
                members_at_end = ha.members()

                async def primary_reachable() -> bool:
                    with contextlib.suppress(
                        OSError,
                        asyncpg.PostgresError,
                        asyncpg.InterfaceError,
                        asyncpg.InternalClientError,  # no host is read-write (yet)
                    ):
                        async with direct(ha.dsn):
                            return True
                    return False

                await wait_until(primary_reachable, f"the primary ({members_at_end})", within=60)

        async with direct(ha.dsn) as conn:
            lost_grants, lost_releases = await lost_acknowledgements(
                conn, traffic.acked_grants, traffic.acked_releases
            )
            per_key = await duplicated_keys(conn)
            preemptions = await conn.fetchval(
                "SELECT count(*) FROM respool.events WHERE to_status IN ('preempting', 'preempted')"
            )
    finally:
        server.close()
    transport_errors = {k: v for k, v in traffic.codes.items() if not k.isdigit()}
    figures = {
        **traffic.summary(),
        "polls": traffic.tally["polls"],
        "preemption_events": preemptions,
        "faults": faults,
        "acked_grants_lost": len(lost_grants),
        "acked_releases_lost": len(lost_releases),
        "duplicates": per_key + len(traffic.id_changes),
        "auditor_snapshots": auditor.snapshots,
        "auditor_outages": auditor.outages,
        "violations": len(auditor.violations),
        "readyz_node": readyz.get("node"),
    }
    record("HA failover (Patroni switchover, kill -9 postmaster)", **figures)
    assert traffic.anomalies == [], traffic.anomalies[:10]
    assert transport_errors == {}, transport_errors  # the API never dropped a connection
    assert lost_grants == [] and lost_releases == []
    assert figures["duplicates"] == 0
    assert auditor.violations == [], auditor.violations[:10]
    # Every long-poll was answered (no anomaly above); how many GET polls a run makes (besides
    # the create's own ?wait) depends on the machine's speed, so it is reported, not asserted.
    assert traffic.tally["cycles"] > 0
    assert len(faults) == 2
