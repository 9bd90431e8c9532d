"""Scenario ``depth``: what one release that grants costs, against the length of the queue.

Through the engine only (one asyncpg connection, a fresh database per depth): a pool of
``--gpus`` GPUs is held by that many one-GPU requests and ``depth`` more wait behind them, each
of one GPU. Each sample is one ``respool.release_request`` in its own transaction, which ends a
holder and grants the head of the queue; a new request is then queued (not timed), so the depth
stays the same. The figure is the median (and p90) of ``--samples`` releases per depth, and the
ratio of each depth's median to the empty queue's: a grant that touches only what it grants
costs the same at any depth. Commits do not wait for the disk (``synchronous_commit = off`` on
the bench's connection), so the figure is the engine's work.

With an empty queue the release grants nothing; a new holder is created afterwards (not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from app.db import batch as db_batch
from app.db import requests as db_requests
from bench import common
from bench.common import DEFAULT_DSN, Figures, broken_invariants, gpu_members, log, report

SUMMARY = "release → grant time against queue depth (engine, one connection)"
DEPTHS = (0, 100, 1000, 3000, 10000)


@dataclass
class DepthResults(Figures):
    gpus: int
    samples: int
    depths: list[int]
    median_ms: list[float]
    p90_ms: list[float]
    ratio_to_empty: list[float]


async def _queue(conn: asyncpg.Connection, n: int, tag: str) -> list[UUID]:
    """Create ``n`` one-GPU requests (batches of up to 1,000); their ids in order."""
    ids: list[UUID] = []
    for start in range(0, n, 1000):
        members = gpu_members("d", min(1000, n - start), f"{tag}-{start}")
        rows = await db_batch.create_requests(conn, members, all_or_nothing=False)
        ids.extend(r.request.id for r in rows)
    return ids


async def _one_depth(dsn: str, gpus: int, depth: int, samples: int) -> list[float]:
    conn = await common.bench_connect(dsn)
    try:
        # The engine's work, not the disk's: each sample's commit does not wait for its flush.
        await conn.execute("SET synchronous_commit = off")
        await conn.execute(
            "SELECT respool.create_pool(p_name => 'd', p_capacity => $1)", {"gpu": gpus}
        )
        await conn.execute("SELECT respool.create_policy(p_subject => 'd', p_pool => 'd')")
        holders = await _queue(conn, gpus, "hold")
        await _queue(conn, depth, "wait")
        await conn.execute("ANALYZE")
        times: list[float] = []
        for i in range(samples):
            victim = holders[i % len(holders)]
            started = time.perf_counter()
            doc = await db_requests.release_request(conn, victim)
            times.append((time.perf_counter() - started) * 1000)
            if doc.status != "released":
                raise SystemExit(f"depth: release answered {doc.status}")
            # The one the release granted (the queue's head) is the next holder to release.
            granted = await conn.fetchval(
                "SELECT id FROM respool.requests WHERE status = 'allocated'"
                " ORDER BY allocated_at DESC, id DESC LIMIT 1"
            )
            if depth:
                holders[i % len(holders)] = granted
                await _queue(conn, 1, f"refill-{i}")
            else:
                holders[i % len(holders)] = (await _queue(conn, 1, f"hold-{i}"))[0]
        allocated = await conn.fetchval(
            "SELECT count(*) FROM respool.requests WHERE status = 'allocated'"
        )
        if allocated != gpus:
            raise SystemExit(f"depth: {allocated} allocated after the run, expected {gpus}")
        if await broken_invariants(conn):
            raise SystemExit("depth: invariant violations")
        return times
    finally:
        await conn.close()


async def _run(args: argparse.Namespace) -> DepthResults:
    await common.durable_server(args.dsn)
    medians: list[float] = []
    p90s: list[float] = []
    for depth in args.depths:
        async with common.fresh_database(args.dsn) as dsn:
            times = await _one_depth(dsn, args.gpus, depth, args.samples)
        medians.append(round(statistics.median(times), 3))
        p90s.append(round(statistics.quantiles(times, n=10)[-1], 3))
        log(f"depth {depth}: median {medians[-1]} ms, p90 {p90s[-1]} ms")
    return DepthResults(
        gpus=args.gpus,
        samples=args.samples,
        depths=list(args.depths),
        median_ms=medians,
        p90_ms=p90s,
        ratio_to_empty=[round(m / medians[0], 2) for m in medians],
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a durable PostgreSQL server")
    parser.add_argument("--gpus", type=int, default=20)
    parser.add_argument("--samples", type=int, default=150)
    parser.add_argument(
        "--depths",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(DEPTHS),
        help="comma-separated queue depths (default 0,100,1000,3000,10000)",
    )


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_run(args))
    rows = [
        (d, m, p, r)
        for d, m, p, r in zip(
            result.depths, result.median_ms, result.p90_ms, result.ratio_to_empty, strict=True
        )
    ]
    return report(result, ("queued", "median ms", "p90 ms", "÷ empty"), rows)
