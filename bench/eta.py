"""ETA calibration (docs/scheduling.md, "ETA") on a replayed trace: how often is a queued
request's real wait within its ``p50_seconds`` and within its ``p90_seconds``?

The trace is a seeded synthetic job stream (or a CSV given with ``--trace``: one job a line,
``arrival_seconds,gpu,hold_seconds``) replayed against one best_effort pool of 8 GPUs (default
settings: starvation guard 300 s, fifo) on the engine's own clock: every create and release
passes ``p_now``, so a trace of hours replays in seconds and nothing sleeps.

The same trace is replayed twice in one run, each time in a fresh database: once with the
estimator of this checkout ("after") and once with the estimator of an earlier commit
(``--before REF``, default the last commit before the estimator conditioned on the holders' ages
with a tail and a minimum sample count: ``sql/functions/037_eta.sql`` of that commit replaces
this checkout's, "before"). Two readings per replay:

* on arrival: when a job is queued, its ``eta`` is read at that instant; its real wait is
  ``allocated_at - queued_at``;
* while waiting: after every arrival and release, every queued job's estimate is read again (one
  ``respool._eta_pool`` simulation) and compared with the wait it still had from that instant.

A calibrated estimate has about 50 % of the real waits within ``p50_seconds`` and about 90 %
within ``p90_seconds``. Only estimates that were given count (``eta`` is null while the pool has
too few recorded holds).
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
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from app.db.dsn import redact_dsn
from bench.common import REPO, bench_connect, fresh_database
from bench.wake import DEFAULT_DSN

SUMMARY = (
    "ETA calibration on a replayed trace: share of real waits within p50 and p90, before/after"
)
CAPACITY = 8
CLOCK0 = datetime(2030, 1, 1, tzinfo=UTC)
ETA_SQL = "sql/functions/037_eta.sql"
# The last commit whose ETA froze once a holder outlived every recorded hold (and gave a p90
# from a single recorded hold): the "before" of this benchmark.
BEFORE_REF = "5acfb3a81f35eacc20310ec9315d1ff294185362"
# Helpers an older estimator calls that the engine has since folded into its capacity model
# (docs/engine.md): created beside the older 037_eta.sql so that it runs as it did.
BEFORE_HELPERS = """
CREATE OR REPLACE FUNCTION respool._fits_room_vector(p_need bigint[], p_room bigint[])
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT NOT EXISTS (SELECT FROM generate_subscripts(p_need, 1) j
                        WHERE p_need[j] > 0 AND p_need[j] > p_room[j])
$$;
"""

CREATE = (
    "SELECT request FROM respool.create_request(jsonb_build_object('subject', 'team',"
    " 'pool', 'p', 'resources', $1::jsonb, 'lease_seconds', NULL), p_now => $2)"
)
ETA = "SELECT respool._eta($1, $2, $3)"
ETA_POOL = "SELECT request_id, p50_seconds, p90_seconds FROM respool._eta_pool($1, $2)"
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


@dataclass(frozen=True)
class Reading:
    """One estimate shown and the wait that followed it (seconds)."""

    p50: int
    p90: int
    wait: float


@dataclass(frozen=True)
class Calibration:
    estimates: int
    under_p50: float | None  # share of waits <= p50_seconds
    under_p90: float | None  # share of waits <= p90_seconds
    median_abs_error_p50: float | None

    @classmethod
    def of(cls, readings: list[Reading]) -> Calibration:
        if not readings:
            return cls(0, None, None, None)
        n = len(readings)
        return cls(
            estimates=n,
            under_p50=sum(r.wait <= r.p50 for r in readings) / n,
            under_p90=sum(r.wait <= r.p90 for r in readings) / n,
            median_abs_error_p50=statistics.median(abs(r.p50 - r.wait) for r in readings),
        )


@dataclass(frozen=True)
class EtaFigures:
    jobs: int
    queued: int
    median_real_wait: float | None
    on_arrival: Calibration
    while_waiting: Calibration

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "queued": self.queued,
            "median_real_wait": self.median_real_wait,
            "on_arrival": dict(self.on_arrival.__dict__),
            "while_waiting": dict(self.while_waiting.__dict__),
        }


def synthetic_trace(jobs: int, seed: int, load: float, holds: str = "lognormal") -> list[Job]:
    """Poisson arrivals; 1, 2 or 4 GPUs (50/30/20 %); holds with a median of 300 s, log-normal
    (sigma 0.8) or, with ``holds="pareto"``, heavy-tailed (Pareto, shape 1.2)."""
    rng = random.Random(seed)
    sizes, weights = (1, 2, 4), (0.5, 0.3, 0.2)
    mean_size = sum(s * w for s, w in zip(sizes, weights, strict=True))
    median_hold, sigma, shape = 300.0, 0.8, 1.2
    scale = median_hold / 2 ** (1 / shape)  # Pareto: median = scale * 2^(1/shape)
    if holds == "pareto":
        mean_hold = scale * shape / (shape - 1)
    else:
        mean_hold = median_hold * math.exp(sigma**2 / 2)
    gap = mean_size * mean_hold / (CAPACITY * load)  # mean seconds between arrivals
    t, out = 0.0, []
    for _ in range(jobs):
        t += rng.expovariate(1 / gap)
        gpu = rng.choices(sizes, weights)[0]
        if holds == "pareto":
            hold = scale * rng.paretovariate(shape)
        else:
            hold = rng.lognormvariate(math.log(median_hold), sigma)
        out.append(Job(t, gpu, hold))
    return out


def read_trace(path: Path) -> list[Job]:
    with path.open(newline="") as f:
        return sorted(
            (Job(float(a), int(g), float(h)) for a, g, h in csv.reader(f) if a.strip()),
            key=lambda j: j.arrival,
        )


def before_sql(ref: str) -> str:
    """``sql/functions/037_eta.sql`` as it was at ``ref`` (read from the checkout's git)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{ref}:{ETA_SQL}"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        raise SystemExit(f"--before: cannot run git: {exc}") from None
    if done.returncode != 0:
        raise SystemExit(f"--before: no {ETA_SQL} at {ref!r} in this checkout's git history")
    return done.stdout


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
    on_arrival: dict[UUID, tuple[int, int] | None] = {}
    later: list[tuple[UUID, float, int, int]] = []  # (request, read at, p50, p90)
    granted_at: dict[UUID, float] = {}
    real_wait: dict[UUID, float] = {}

    async def schedule_grants() -> None:
        nonlocal seq
        if not waiting:
            return
        for row in await conn.fetch(GRANTED, list(waiting)):
            job = trace[waiting.pop(row["id"])]
            real_wait[row["id"]] = (row["allocated_at"] - row["queued_at"]).total_seconds()
            granted_at[row["id"]] = (row["allocated_at"] - CLOCK0).total_seconds()
            end = granted_at[row["id"]] + job.hold
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
                eta = await conn.fetchval(ETA, pool_id, rid, now)
                on_arrival[rid] = None if eta is None else (eta["p50_seconds"], eta["p90_seconds"])
            waiting[rid] = payload
        else:
            await conn.execute(RELEASE, payload, now)
        await schedule_grants()
        if waiting:
            for row in await conn.fetch(ETA_POOL, pool_id, now):
                later.append((row["request_id"], t, row["p50_seconds"], row["p90_seconds"]))

    queued = [rid for rid in on_arrival if rid in real_wait]
    arrival_readings = [
        Reading(e[0], e[1], real_wait[rid]) for rid in queued if (e := on_arrival[rid]) is not None
    ]
    waiting_readings = [
        Reading(p50, p90, granted_at[rid] - t) for rid, t, p50, p90 in later if rid in granted_at
    ]
    waits = [real_wait[r] for r in queued]
    return EtaFigures(
        jobs=len(trace),
        queued=len(queued),
        median_real_wait=statistics.median(waits) if waits else None,
        on_arrival=Calibration.of(arrival_readings),
        while_waiting=Calibration.of(waiting_readings),
    )


async def measure(dsn: str, trace: list[Job], estimator_sql: str | None = None) -> EtaFigures:
    """Replay ``trace`` in a fresh database; ``estimator_sql`` (an older 037_eta.sql) replaces
    the checkout's estimator first."""
    async with fresh_database(dsn) as db:
        conn = await bench_connect(db)
        try:
            if estimator_sql is not None:
                await conn.execute(BEFORE_HELPERS)
                await conn.execute(estimator_sql)
            return await replay(conn, trace)
        finally:
            await conn.close()


async def calibrate(dsn: str, trace: list[Job], before: str | None) -> dict[str, EtaFigures]:
    out: dict[str, EtaFigures] = {}
    if before is not None:
        out["before"] = await measure(dsn, trace, before)
    out["after"] = await measure(dsn, trace)
    return out


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _load(text: str) -> float:
    value = float(text)
    if not 0 < value < 1.5:
        raise argparse.ArgumentTypeError("must be between 0 and 1.5")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs", type=_positive_int, default=600, help="synthetic jobs (default 600)"
    )
    parser.add_argument("--seed", type=int, default=1, help="synthetic trace seed (default 1)")
    parser.add_argument(
        "--load", type=_load, default=0.9, help="offered load of the synthetic trace (default 0.9)"
    )
    parser.add_argument(
        "--holds",
        choices=("lognormal", "pareto"),
        default="lognormal",
        help="hold times of the synthetic trace (default lognormal)",
    )
    parser.add_argument("--trace", type=Path, help="CSV arrival_seconds,gpu,hold_seconds instead")
    parser.add_argument(
        "--before",
        default=BEFORE_REF,
        metavar="REF",
        help="git commit whose estimator is the 'before' (default: the last one before the"
        " age-conditioned estimator); 'none' to replay only this checkout's",
    )
    parser.add_argument(
        "--dsn",
        default=DEFAULT_DSN,
        help="a PostgreSQL server where we may CREATE DATABASE (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def _share(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} s"


def run(args: argparse.Namespace) -> int:
    trace = (
        read_trace(args.trace)
        if args.trace
        else synthetic_trace(args.jobs, args.seed, args.load, args.holds)
    )
    if not trace:
        raise SystemExit("--trace: the trace is empty")
    before = None if args.before == "none" else before_sql(args.before)
    figures = asyncio.run(calibrate(args.dsn, trace, before))
    if args.json:
        print(json.dumps({k: v.as_dict() for k, v in figures.items()}))
        return 0
    source = (
        str(args.trace)
        if args.trace
        else f"synthetic {args.holds} holds, seed {args.seed}, load {args.load:g}"
    )
    after = figures["after"]
    print(f"respool ETA calibration: {after.jobs} jobs ({source}) on {redact_dsn(args.dsn)}")
    print(f"  queued on arrival: {after.queued}, real wait: median {_secs(after.median_real_wait)}")
    print()
    print(
        "| estimator | reading | estimates | wait <= p50 | wait <= p90 | median abs(p50 - wait) |"
    )
    print("|---|---|---|---|---|---|")
    for name, fig in figures.items():
        label = f"{name} ({args.before[:7]})" if name == "before" else name
        for reading, cal in (("on arrival", fig.on_arrival), ("while waiting", fig.while_waiting)):
            print(
                f"| {label} | {reading} | {cal.estimates:,} | {_share(cal.under_p50)} |"
                f" {_share(cal.under_p90)} | {_secs(cal.median_abs_error_p50)} |"
            )
    return 0
