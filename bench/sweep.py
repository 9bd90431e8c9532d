"""Scenario ``sweep``: a hyperparameter sweep through the API, against its ideal makespan.

``--steps`` one-GPU steps (default 10,000) on a pool of ``--gpus`` GPUs (default 1,000), each
holding for a time drawn uniformly from 1–3 s (seeded, so every run replays the same trace).
All steps start at once, each a client of its own on its own keep-alive HTTP connection to one
``respool serve`` process (default pool of 10 database connections, the reconciler on): it
creates its request with ``?wait=`` (a long-poll), long-polls again while queued, holds for its
time once allocated, then releases. Makespan = from the first create sent to the last release
answered. The ideal makespan is that of the same trace with zero scheduling cost: steps start
in step order on the first free GPU (list scheduling), the order the queue grants them in.
Correctness: every step allocated exactly once, every request released, no invariant broken.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from bench.common import (
    Figures,
    add_dsn_argument,
    bench_connect,
    durable_server,
    fresh_database,
    log,
    report,
)
from bench.rawhttp import Connection, Reply, split_url
from bench.waiters import _raise_fd_limit
from bench.wake import percentile, serve

SUMMARY = "a sweep of one-GPU steps through the API: makespan vs the ideal of the same trace"
SEED = 17
OPENING = 200  # connections opened at a time (the server's accept queue is finite)
POLL = 25  # seconds per long-poll (RESPOOL_MAX_WAIT's default)

_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class SweepResult(Figures):
    steps: int
    gpus: int
    makespan_s: float
    ideal_s: float
    submitted_s: float
    grant_lag_p50_ms: float
    grant_lag_p99_ms: float
    polls: int
    retries_503: int
    correct: bool
    problems: tuple[str, ...]

    @property
    def ratio(self) -> float:
        return self.makespan_s / self.ideal_s

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["ratio"] = self.ratio
        return out


def trace(steps: int) -> list[float]:
    rng = random.Random(SEED)  # noqa: S311 - a replayable trace, not crypto
    return [rng.uniform(1.0, 3.0) for _ in range(steps)]


def ideal_starts(holds: list[float], gpus: int) -> list[float]:
    """Start times with zero scheduling cost: step order, each on the first GPU that frees."""
    free = [0.0] * gpus
    starts = []
    for h in holds:
        t = heapq.heappop(free)
        starts.append(t)
        heapq.heappush(free, t + h)
    return starts


RETRY_FOR = 600.0  # seconds a step keeps retrying a 503


async def _call(
    conn: Connection, method: str, target: str, body: bytes | None, out: dict[str, Any]
) -> Reply:
    """One call; a 503 (the API's database pool is busy) is retried after a jittered
    exponential backoff for up to RETRY_FOR seconds, as respool-client does (its ``retry_for``:
    a sweep of thousands of steps sets it well above its 60 s default)."""
    deadline = time.monotonic() + RETRY_FOR
    attempt = 0
    while True:
        reply = await conn.request(method, target, body)
        if reply.status != 503 or time.monotonic() > deadline:
            return reply
        out["retries"] += 1
        await asyncio.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))  # noqa: S311
        attempt += 1


async def _step(
    url: str, i: int, hold: float, opening: asyncio.Semaphore, out: dict[str, Any]
) -> None:
    host, port = split_url(url)
    async with opening:
        conn = await Connection(host, port).open()
    try:
        # An idempotency key per step: a retried create is the same request.
        body = msgspec.json.encode(
            {
                "subject": "sweep",
                "pool": "sweep",
                "resources": {"gpu": 1},
                "idempotency_key": f"step-{i}",
            }
        )
        out["submitted"][i] = time.perf_counter()
        reply = await _call(conn, "POST", f"/v1/requests?wait={POLL}", body, out)
        if reply.status not in (200, 201):
            raise SystemExit(f"step {i}: create answered {reply.status}: {reply.body[:200]!r}")
        doc = _decode(reply.body)
        while doc["status"] == "queued":
            out["polls"] += 1
            target = f"/v1/requests/{doc['id']}?wait={POLL}&version={doc['version']}"
            reply = await _call(conn, "GET", target, None, out)
            if reply.status != 200:
                raise SystemExit(f"step {i}: poll answered {reply.status}: {reply.body[:200]!r}")
            doc = _decode(reply.body)
        if doc["status"] != "allocated":
            out["problems"].append(f"step {i}: {doc['status']} ({doc.get('reason')})")
            return
        out["granted"][i] = reply.first_byte
        await asyncio.sleep(hold)
        done = await _call(conn, "POST", f"/v1/requests/{doc['id']}/release", None, out)
        if done.status != 200 or _decode(done.body)["status"] != "released":
            out["problems"].append(f"step {i}: release answered {done.status}")
        out["released"][i] = time.perf_counter()
    finally:
        await conn.close()


async def measure(dsn: str, steps: int, gpus: int) -> SweepResult:
    holds = trace(steps)
    ideal = ideal_starts(holds, gpus)
    ideal_s = max(s + h for s, h in zip(ideal, holds, strict=True))
    _raise_fd_limit(steps + 1000)
    conn = await bench_connect(dsn)
    out: dict[str, Any] = {
        "submitted": [0.0] * steps,
        "granted": [0.0] * steps,
        "released": [0.0] * steps,
        "polls": 0,
        "retries": 0,
        "problems": [],
    }
    try:
        await conn.execute(
            "SELECT respool.create_pool(p_name => 'sweep', p_capacity => $1)", {"gpu": gpus}
        )
        await conn.execute("SELECT respool.create_policy(p_subject => 'sweep', p_pool => 'sweep')")
        env = {
            "RESPOOL_MAX_WAITS": str(steps + 1000),
            "RESPOOL_MAX_WAITS_PER_TOKEN": str(steps + 1000),
            "RESPOOL_MAX_WAIT": str(POLL),
            "RESPOOL_MAX_CONNECTIONS": str(steps + 1000),  # one connection per step
        }
        with serve(dsn, reconciler=True, env=env) as url:
            opening = asyncio.Semaphore(OPENING)
            started = time.perf_counter()
            await asyncio.gather(*(_step(url, i, h, opening, out) for i, h in enumerate(holds)))
            makespan = max(out["released"]) - started
        submitted = max(out["submitted"]) - started
        # How late each grant came against the moment its GPU would have been free with zero
        # scheduling cost, shifted to the real start.
        lags = [max(0.0, g - started - s) for g, s in zip(out["granted"], ideal, strict=True) if g]
        problems: list[str] = list(out["problems"])
        row = await conn.fetchrow(
            "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'released') AS released,"
            "       count(*) FILTER (WHERE version <> 3) AS odd"
            "  FROM respool.requests"
        )
        assert row is not None
        if row["n"] != steps or row["released"] != steps or row["odd"]:
            problems.append(f"in the database: {dict(row)}")
        if await conn.fetchval("SELECT count(*) FROM respool.invariant_violations"):
            problems.append("invariant violations")
    finally:
        await conn.close()
    result = SweepResult(
        steps=steps,
        gpus=gpus,
        makespan_s=makespan,
        ideal_s=ideal_s,
        submitted_s=submitted,
        grant_lag_p50_ms=percentile(lags, 50) * 1000 if lags else float("nan"),
        grant_lag_p99_ms=percentile(lags, 99) * 1000 if lags else float("nan"),
        polls=out["polls"],
        retries_503=out["retries"],
        correct=not problems,
        problems=tuple(problems[:20]),
    )
    log(
        f"  sweep: {steps:,} steps on {gpus:,} GPUs: makespan {makespan:.1f} s, ideal "
        f"{ideal_s:.1f} s ({result.ratio:.2f} ×); all creates sent after {submitted:.1f} s; "
        f"correct: {result.correct}"
    )
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dsn_argument(parser)
    parser.add_argument("--steps", type=int, default=10_000, help="steps (10000)")
    parser.add_argument("--gpus", type=int, default=1000, help="GPUs in the pool (1000)")


async def _run(args: argparse.Namespace) -> SweepResult:
    await durable_server(args.dsn)
    async with fresh_database(args.dsn) as dsn:
        return await measure(dsn, args.steps, args.gpus)


def run(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.gpus < 1:
        raise SystemExit("--steps and --gpus must be >= 1")
    r = asyncio.run(_run(args))
    verdict = "yes" if r.correct else "NO: " + "; ".join(r.problems[:3])
    return report(
        r,
        [
            "steps",
            "GPUs",
            "makespan",
            "ideal",
            "ratio",
            "all creates sent after",
            "grant lag p50 / p99",
            "long-polls after create",
            "503 retries",
            "correct",
        ],
        [
            [
                f"{r.steps:,}",
                f"{r.gpus:,}",
                f"{r.makespan_s:.1f} s",
                f"{r.ideal_s:.1f} s",
                f"{r.ratio:.2f}",
                f"{r.submitted_s:.1f} s",
                f"{r.grant_lag_p50_ms:,.0f} / {r.grant_lag_p99_ms:,.0f} ms",
                f"{r.polls:,}",
                f"{r.retries_503:,}",
                verdict,
            ]
        ],
    )
