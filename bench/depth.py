"""Scenario ``depth``: what one release that grants costs, against the length of the queue.

Through the engine only (a fresh database and one asyncpg connection per depth): a pool of
``--gpus`` GPUs is held by that many one-GPU requests and ``depth`` more wait behind them, each
of one GPU. Each sample is one ``respool.release_request`` in its own transaction, which ends a
holder and grants the head of the queue; a new request is then queued (not timed), so the depth
stays the same. The figure is the median (and p90) of ``--samples`` releases per depth, and the
ratio of each depth's median to the empty queue's and to a queue of one (a release that grants
with nothing else waiting): a grant that touches only what it grants costs the same at any
depth. Every depth has its own database and connection, set up first; then the samples go
round the depths (sample i of each before sample i + 1 of any), so the ratios are measured side
by side. Commits do not wait for the disk (``synchronous_commit = off`` on the bench's
connections), so the figure is the engine's work.

With an empty queue the release grants nothing; a new holder is created afterwards (not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
DEPTHS = (0, 1, 100, 1000, 3000, 10000)


@dataclass
class DepthResults(Figures):
    gpus: int
    samples: int
    depths: list[int]
    median_ms: list[float]
    p90_ms: list[float]
    ratio_to_empty: list[float]
    ratio_to_one: list[float] | None  # None: depth 1 not measured


async def _queue(conn: asyncpg.Connection, n: int, tag: str) -> list[UUID]:
    """Create ``n`` one-GPU requests (batches of up to 1,000); their ids in order."""
    ids: list[UUID] = []
    for start in range(0, n, 1000):
        members = gpu_members("d", min(1000, n - start), f"{tag}-{start}")
        rows = await db_batch.create_requests(conn, members, all_or_nothing=False)
        ids.extend(r.request.id for r in rows)
    return ids


class _Depth:
    """One depth's database: a full pool with ``depth`` waiting behind it, released one sample
    at a time."""

    def __init__(self, conn: asyncpg.Connection, gpus: int, depth: int) -> None:
        self.conn, self.gpus, self.depth = conn, gpus, depth
        self.holders: list[UUID] = []
        self.times: list[float] = []

    async def setup(self) -> None:
        # The engine's work, not the disk's: each sample's commit does not wait for its flush.
        await self.conn.execute("SET synchronous_commit = off")
        await self.conn.execute(
            "SELECT respool.create_pool(p_name => 'd', p_capacity => $1)", {"gpu": self.gpus}
        )
        await self.conn.execute("SELECT respool.create_policy(p_subject => 'd', p_pool => 'd')")
        self.holders = await _queue(self.conn, self.gpus, "hold")
        await _queue(self.conn, self.depth, "wait")
        await self.conn.execute("ANALYZE")

    async def sample(self, i: int) -> None:
        """Time one release; then make the depth what it was (not timed)."""
        started = time.perf_counter()
        doc = await db_requests.release_request(self.conn, self.holders[i % self.gpus])
        self.times.append((time.perf_counter() - started) * 1000)
        if doc.status != "released":
            raise SystemExit(f"depth: release answered {doc.status}")
        if self.depth:
            # The one the release granted (the queue's head) is the next holder to release.
            self.holders[i % self.gpus] = await self.conn.fetchval(
                "SELECT id FROM respool.requests WHERE status = 'allocated'"
                " ORDER BY allocated_at DESC, id DESC LIMIT 1"
            )
            await _queue(self.conn, 1, f"refill-{i}")
        else:
            self.holders[i % self.gpus] = (await _queue(self.conn, 1, f"hold-{i}"))[0]

    async def check(self) -> None:
        allocated = await self.conn.fetchval(
            "SELECT count(*) FROM respool.requests WHERE status = 'allocated'"
        )
        if allocated != self.gpus:
            raise SystemExit(f"depth: {allocated} allocated after the run, expected {self.gpus}")
        if await broken_invariants(self.conn):
            raise SystemExit("depth: invariant violations")


async def _run(args: argparse.Namespace) -> DepthResults:
    await common.durable_server(args.dsn)
    async with contextlib.AsyncExitStack() as stack:
        runs: list[_Depth] = []
        for depth in args.depths:
            dsn = await stack.enter_async_context(common.fresh_database(args.dsn))
            conn = await common.bench_connect(dsn)
            stack.push_async_callback(conn.close)
            runs.append(_Depth(conn, args.gpus, depth))
            await runs[-1].setup()
            log(f"depth {depth}: set up")
        # Side by side: sample i of every depth before sample i + 1 of any, so a change in the
        # machine's load touches every depth alike.
        log(f"sampling: {args.samples} releases per depth, round the depths")
        for i in range(args.samples):
            for run in runs:
                await run.sample(i)
        for run in runs:
            await run.check()
    medians = [round(statistics.median(r.times), 3) for r in runs]
    p90s = [round(statistics.quantiles(r.times, n=10)[-1], 3) for r in runs]
    for depth, m, p in zip(args.depths, medians, p90s, strict=True):
        log(f"depth {depth}: median {m} ms, p90 {p} ms")
    one = medians[args.depths.index(1)] if 1 in args.depths else None
    return DepthResults(
        gpus=args.gpus,
        samples=args.samples,
        depths=list(args.depths),
        median_ms=medians,
        p90_ms=p90s,
        ratio_to_empty=[round(m / medians[0], 2) for m in medians],
        ratio_to_one=[round(m / one, 2) for m in medians] if one else None,
    )


def _depths(text: str) -> list[int]:
    """``--depths``: distinct queue lengths, the first 0 (the reference: a release alone)."""
    try:
        depths = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if depths[0] != 0 or min(depths) < 0 or len(set(depths)) != len(depths):
        raise argparse.ArgumentTypeError("expected distinct queue depths >= 0, the first 0")
    return depths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a durable PostgreSQL server")
    parser.add_argument("--gpus", type=int, default=20)
    parser.add_argument("--samples", type=int, default=150)
    parser.add_argument(
        "--depths",
        type=_depths,
        default=list(DEPTHS),
        help="comma-separated queue depths, the first 0 (default 0,1,100,1000,3000,10000)",
    )


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_run(args))
    blank: list[object] = ["—"] * len(result.depths)
    to_one: list[object] = list(result.ratio_to_one) if result.ratio_to_one else blank
    rows = list(
        zip(
            result.depths, result.median_ms, result.p90_ms, result.ratio_to_empty, to_one,
            strict=True,
        )
    )  # fmt: skip
    return report(result, ("queued", "median ms", "p90 ms", "÷ empty", "÷ one queued"), rows)
