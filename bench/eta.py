"""ETA accuracy (docs/scheduling.md, "ETA") on a replayed trace: how close is a queued
request's ``eta`` to the wait it really had?

The trace is a seeded synthetic job stream (or a CSV given with ``--trace``: one job a line,
``arrival_seconds,gpu,hold_seconds``) replayed against one best_effort pool of 8 GPUs (default
settings: starvation guard 300 s, fifo) on the engine's own clock: every create and release
passes ``p_now``, so a trace of hours replays in seconds and nothing sleeps. When a job arrives
and is queued, its ``eta`` is read at that instant (``respool._eta`` at the same ``p_now``);
when it is granted, its real wait is ``allocated_at - queued_at``. Reported: the median absolute
error of ``p50_seconds`` and how often the real wait was at most ``p90_seconds`` (a calibrated
p90 gives about 90 %), over the queued jobs that had an estimate (the first holds of the pool
build its history; until then ``eta`` is null).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import heapq
import json
import math
import random
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from app.db.dsn import redact_dsn
from bench.common import bench_connect, fresh_database
from bench.wake import DEFAULT_DSN

SUMMARY = "ETA accuracy on a replayed trace: median |p50 - real wait|, share of waits <= p90"
CAPACITY = 8
CLOCK0 = datetime(2030, 1, 1, tzinfo=UTC)

CREATE = (
    "SELECT request FROM respool.create_request(jsonb_build_object('subject', 'team',"
    " 'pool', 'p', 'resources', $1::jsonb, 'lease_seconds', NULL), p_now => $2)"
)
ETA = "SELECT respool._eta($1, $2, $3)"
RELEASE = "SELECT respool.release_request(p_id => $1, p_now => $2)"
GRANTED = (
    "SELECT id, allocated_at, queued_at FROM respool.requests"
    " WHERE id = ANY ($1::uuid[]) AND status = 'allocated'"
)


@dataclass(frozen=True)
class Job:
    arrival: float  # seconds from the start of the trace
    gpu: int
    hold: float  # seconds it holds its GPUs once granted


@dataclass
class EtaFigures:
    jobs: int
    queued: int
    with_eta: int
    median_abs_error_p50: float | None
    mean_real_wait: float | None
    median_real_wait: float | None
    under_p90: float | None  # share of waits <= p90_seconds

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def synthetic_trace(jobs: int, seed: int, load: float) -> list[Job]:
    """Poisson arrivals; 1, 2 or 4 GPUs (50/30/20 %); log-normal holds (median 300 s)."""
    rng = random.Random(seed)
    sizes, weights = (1, 2, 4), (0.5, 0.3, 0.2)
    mean_size = sum(s * w for s, w in zip(sizes, weights, strict=True))
    median_hold, sigma = 300.0, 0.8
    mean_hold = median_hold * math.exp(sigma**2 / 2)
    gap = mean_size * mean_hold / (CAPACITY * load)  # mean seconds between arrivals
    t, out = 0.0, []
    for _ in range(jobs):
        t += rng.expovariate(1 / gap)
        gpu = rng.choices(sizes, weights)[0]
        out.append(Job(t, gpu, rng.lognormvariate(math.log(median_hold), sigma)))
    return out


def read_trace(path: Path) -> list[Job]:
    with path.open(newline="") as f:
        return sorted(
            (Job(float(a), int(g), float(h)) for a, g, h in csv.reader(f) if a.strip()),
            key=lambda j: j.arrival,
        )


async def replay(conn: asyncpg.Connection, trace: list[Job]) -> EtaFigures:
    pool = await conn.fetchval(
        "SELECT (respool.create_pool(p_name => 'p', p_capacity => $1)) ->> 'id'",
        {"gpu": CAPACITY},
    )
    await conn.execute("SELECT respool.create_policy(p_subject => 'team', p_pool => 'p')")
    pool_id = UUID(pool)
    # (time, order, kind, payload): arrivals and releases in time order
    events: list[tuple[float, int, str, Any]] = [
        (j.arrival, i, "arrive", i) for i, j in enumerate(trace)
    ]
    heapq.heapify(events)
    seq = len(trace)
    waiting: dict[UUID, int] = {}  # queued request -> job index
    estimate: dict[UUID, dict[str, int] | None] = {}
    real_wait: dict[UUID, float] = {}

    async def schedule_grants() -> None:
        nonlocal seq
        if not waiting:
            return
        for row in await conn.fetch(GRANTED, list(waiting)):
            job = trace[waiting.pop(row["id"])]
            real_wait[row["id"]] = (row["allocated_at"] - row["queued_at"]).total_seconds()
            end = (row["allocated_at"] - CLOCK0).total_seconds() + job.hold
            seq += 1
            heapq.heappush(events, (end, seq, "release", row["id"]))

    while events:
        t, _, kind, payload = heapq.heappop(events)
        now = CLOCK0 + timedelta(seconds=t)
        if kind == "arrive":
            job = trace[payload]
            doc = await conn.fetchval(CREATE, {"gpu": job.gpu}, now)
            rid = UUID(doc["id"])
            if doc["status"] == "queued":
                estimate[rid] = await conn.fetchval(ETA, pool_id, rid, now)
            waiting[rid] = payload
        else:
            await conn.execute(RELEASE, payload, now)
        await schedule_grants()

    queued = [rid for rid in estimate if rid in real_wait]
    rated = [rid for rid in queued if estimate[rid] is not None]
    errors = [abs(estimate[r]["p50_seconds"] - real_wait[r]) for r in rated]  # type: ignore[index]
    under = [real_wait[r] <= estimate[r]["p90_seconds"] for r in rated]  # type: ignore[index]
    waits = [real_wait[r] for r in queued]
    return EtaFigures(
        jobs=len(trace),
        queued=len(queued),
        with_eta=len(rated),
        median_abs_error_p50=statistics.median(errors) if errors else None,
        mean_real_wait=statistics.fmean(waits) if waits else None,
        median_real_wait=statistics.median(waits) if waits else None,
        under_p90=sum(under) / len(under) if under else None,
    )


async def measure(dsn: str, trace: list[Job]) -> EtaFigures:
    async with fresh_database(dsn) as db:
        conn = await bench_connect(db)
        try:
            return await replay(conn, trace)
        finally:
            await conn.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=600, help="synthetic jobs (default 600)")
    parser.add_argument("--seed", type=int, default=1, help="synthetic trace seed (default 1)")
    parser.add_argument(
        "--load", type=float, default=0.9, help="offered load of the synthetic trace (default 0.9)"
    )
    parser.add_argument("--trace", type=Path, help="CSV arrival_seconds,gpu,hold_seconds instead")
    parser.add_argument(
        "--dsn",
        default=DEFAULT_DSN,
        help="a PostgreSQL server where we may CREATE DATABASE (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    trace = (
        read_trace(args.trace) if args.trace else synthetic_trace(args.jobs, args.seed, args.load)
    )
    if not trace:
        raise SystemExit("the trace is empty")
    figures = asyncio.run(measure(args.dsn, trace))
    if args.json:
        print(json.dumps(figures.as_dict()))
        return 0
    source = str(args.trace) if args.trace else f"synthetic, seed {args.seed}, load {args.load:g}"
    print(f"respool ETA accuracy: {figures.jobs} jobs ({source}) on {redact_dsn(args.dsn)}")
    print(f"  queued on arrival: {figures.queued}, with an estimate: {figures.with_eta}")

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} s"

    print(
        f"  real wait: median {secs(figures.median_real_wait)}, mean {secs(figures.mean_real_wait)}"
    )
    print(f"  median |p50_seconds - real wait|: {secs(figures.median_abs_error_p50)}")
    share = "-" if figures.under_p90 is None else f"{100 * figures.under_p90:.0f} %"
    print(f"  real wait <= p90_seconds: {share}")
    return 0
