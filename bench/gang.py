"""Scenario ``gang``: gangs (docs/scheduling.md, "Gangs") per second, created and granted.

Three figures, each through the engine (``respool.create_requests`` with all_or_nothing, one
asyncpg connection, a fresh database each):

* **granted at create**: a pool large enough for every gang; each batch is granted whole in its
  own create transaction. Rate = gangs ÷ wall time.
* **created (queued)**: the pool is held by one request, so every gang queues as one entry.
* **granted by a release**: then that holder is released; the one allocation pass of the
  release grants every queued gang that fits, member by member in one transaction.
  Rate = gangs granted ÷ the release's wall time.

After each phase no gang may be partly granted and no invariant broken.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from app.db import batch as db_batch
from app.db import requests as db_requests
from bench import common
from bench.common import DEFAULT_DSN, Figures, broken_invariants, gpu_members, log, report

SUMMARY = "gangs/s created and granted (all_or_nothing batches)"

PARTIAL = """
SELECT count(*) FROM (
    SELECT gang_id FROM respool.requests WHERE gang_id IS NOT NULL GROUP BY gang_id
    HAVING (count(*) FILTER (WHERE status = 'allocated') > 0
            AND count(*) FILTER (WHERE status = 'queued') > 0)
        OR count(DISTINCT allocated_at) FILTER (WHERE status = 'allocated') > 1) g
"""


@dataclass
class GangResults(Figures):
    gangs: int
    gang_size: int
    granted_at_create_per_s: float
    created_queued_per_s: float
    granted_by_release_per_s: float


async def _setup(conn: asyncpg.Connection, capacity: int) -> None:
    await conn.execute(
        "SELECT respool.create_pool(p_name => 'g', p_capacity => $1, p_starvation_seconds => NULL)",
        {"gpu": capacity},
    )
    await conn.execute("SELECT respool.create_policy(p_subject => 'g', p_pool => 'g')")


async def _check(conn: asyncpg.Connection, status: str, expected: int) -> None:
    n = await conn.fetchval("SELECT count(*) FROM respool.requests WHERE status = $1", status)
    if n != expected:
        raise SystemExit(f"gang: {n} {status}, expected {expected}")
    if await conn.fetchval(PARTIAL):
        raise SystemExit("gang: a gang is partly granted")
    if await broken_invariants(conn):
        raise SystemExit("gang: invariant violations")


async def _create(conn: asyncpg.Connection, gangs: int, size: int, what: str) -> float:
    started = time.perf_counter()
    for k in range(gangs):
        await db_batch.create_requests(
            conn,
            gpu_members("g", size, str(k)),
            all_or_nothing=True,
            default_lease_seconds=300,
        )
    rate = gangs / (time.perf_counter() - started)
    log(f"  gang: {what}: {rate:,.0f} gangs/s")
    return rate


async def _granted_at_create(dsn: str, gangs: int, size: int) -> float:
    conn = await common.bench_connect(dsn)
    try:
        await _setup(conn, gangs * size)
        rate = await _create(conn, gangs, size, "granted at create")
        await _check(conn, "allocated", gangs * size)
    finally:
        await conn.close()
    return rate


async def _queued_then_released(dsn: str, gangs: int, size: int) -> tuple[float, float]:
    conn = await common.bench_connect(dsn)
    try:
        await _setup(conn, gangs * size)
        made = await db_batch.create_requests(
            conn, [{"subject": "g", "pool": "g", "resources": {"gpu": gangs * size}}]
        )
        holder: UUID = made[0].request.id
        created = await _create(conn, gangs, size, "created (queued)")
        await _check(conn, "queued", gangs * size)
        started = time.perf_counter()
        await db_requests.release_request(conn, holder)
        granted = gangs / (time.perf_counter() - started)
        log(f"  gang: granted by one release: {granted:,.0f} gangs/s")
        await _check(conn, "allocated", gangs * size)
    finally:
        await conn.close()
    return created, granted


async def measure(admin_dsn: str, gangs: int, size: int) -> GangResults:
    async with common.fresh_database(admin_dsn) as dsn:
        at_create = await _granted_at_create(dsn, gangs, size)
    async with common.fresh_database(admin_dsn) as dsn:
        created, granted = await _queued_then_released(dsn, gangs, size)
    return GangResults(gangs, size, at_create, created, granted)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server (default: %(default)s)")
    parser.add_argument("--gangs", type=int, default=200, help="gangs per phase (200)")
    parser.add_argument("--gang-size", type=int, default=8, help="members per gang (8)")


def run(args: argparse.Namespace) -> int:
    if args.gangs < 1 or not 1 <= args.gang_size <= 1000:
        raise SystemExit("--gangs must be >= 1 and --gang-size 1..1000")
    asyncio.run(common.durable_server(args.dsn))
    r = asyncio.run(measure(args.dsn, args.gangs, args.gang_size))
    return report(
        r,
        [f"{r.gangs:,} gangs of {r.gang_size}", "gangs/s"],
        [
            [label, f"{rate:,.0f}"]
            for label, rate in (
                ("created and granted at create", r.granted_at_create_per_s),
                ("created, queued (pool held)", r.created_queued_per_s),
                ("granted by one release (one allocation pass)", r.granted_by_release_per_s),
            )
        ],
    )
