"""Scenario ``sweep``: a hyperparameter sweep through the API, against its ideal makespan.

``--steps`` one-GPU steps (default 10,000) on a pool of ``--gpus`` GPUs (default 1,000), each
holding for a time drawn uniformly from ``--holds`` (seconds, default 1-3; seeded, so every run
replays the same trace). ``--time-scale F`` compresses the holds: a step holds F × its drawn
time of wall time (``--holds 30-300 --time-scale 0.05``: 1.5-15 s), and the ideal is that of
the compressed trace. All steps start at once, each a client of its own on its own keep-alive
HTTP connection to one ``respool serve`` (``--workers N`` passed on when given; default pool of
10 database connections, the reconciler on): it creates its request with ``?wait=`` (a
long-poll), long-polls again while queued, holds for its time once allocated, then releases.
Every call retries as respool-client does (bench/retrying.py): a 429 or 503 after its
``Retry-After``, a closed connection by reopening it, for up to 600 s; a step that still fails
is counted as failed, and ``--timeout`` bounds the whole run. Makespan = from the first create
sent to the last release answered. The ideal makespan is that of the same trace with zero
scheduling cost: steps start in step order on the first free GPU (list scheduling), the order
the queue grants them in. Correctness: every step allocated exactly once, every request
released, no invariant broken.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import msgspec

from bench import common
from bench.common import Figures, add_dsn_argument, checked, log, report
from bench.rawhttp import split_url
from bench.retrying import RETRY_FOR, GaveUp, RetryingConnection
from bench.waiters import _raise_fd_limit
from bench.wake import percentile, serve, serve_has_option

SUMMARY = "a sweep of one-GPU steps through the API: makespan vs the ideal of the same trace"
SEED = 17
OPENING = 200  # connections opened at a time (the server's accept queue is finite)
POLL = 25  # seconds per long-poll (RESPOOL_MAX_WAIT's default)

_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class SweepResult(Figures):
    steps: int
    gpus: int
    holds_s: tuple[float, float]
    time_scale: float
    workers: int | None
    makespan_s: float
    ideal_s: float
    submitted_s: float
    grant_lag_p50_ms: float
    grant_lag_p99_ms: float
    polls: int
    answers_503: int
    answers_429: int
    transport_errors: int
    failed_steps: int
    timed_out: bool
    correct: bool
    problems: tuple[str, ...]

    @property
    def ratio(self) -> float:
        return self.makespan_s / self.ideal_s

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["ratio"] = self.ratio
        return out


def trace(steps: int, low: float = 1.0, high: float = 3.0, scale: float = 1.0) -> list[float]:
    """Each step's hold in wall seconds: drawn uniformly from ``low``..``high``, times ``scale``."""
    rng = random.Random(SEED)  # noqa: S311 - a replayable trace, not crypto
    return [rng.uniform(low, high) * scale for _ in range(steps)]


def ideal_starts(holds: list[float], gpus: int) -> list[float]:
    """Start times with zero scheduling cost: step order, each on the first GPU that frees."""
    free = [0.0] * gpus
    starts = []
    for h in holds:
        t = heapq.heappop(free)
        starts.append(t)
        heapq.heappush(free, t + h)
    return starts


def _fail(out: dict[str, Any], i: int, why: str) -> None:
    out["failed"] += 1
    out["problems"].append(f"step {i}: {why}")


async def _step(
    url: str, i: int, hold: float, opening: asyncio.Semaphore, out: dict[str, Any]
) -> None:
    host, port = split_url(url)
    conn = RetryingConnection(host, port, out["counts"], retry_for=out["retry_for"])
    async with opening:
        with contextlib.suppress(OSError):  # refused: the first call retries it
            await conn.open()
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
        reply = await conn.call("POST", f"/v1/requests?wait={POLL}", body)
        if reply.status not in (200, 201):
            _fail(out, i, f"create answered {reply.status}: {reply.body[:200]!r}")
            return
        doc = _decode(reply.body)
        while doc["status"] == "queued":
            out["polls"] += 1
            target = f"/v1/requests/{doc['id']}?wait={POLL}&version={doc['version']}"
            reply = await conn.call("GET", target)
            if reply.status != 200:
                _fail(out, i, f"poll answered {reply.status}: {reply.body[:200]!r}")
                return
            doc = _decode(reply.body)
        if doc["status"] != "allocated":
            _fail(out, i, f"{doc['status']} ({doc.get('reason')})")
            return
        out["granted"][i] = reply.first_byte
        await asyncio.sleep(hold)
        done = await conn.call("POST", f"/v1/requests/{doc['id']}/release")
        if done.status != 200 or _decode(done.body)["status"] != "released":
            _fail(out, i, f"release answered {done.status}: {done.body[:200]!r}")
            return
        out["released"][i] = time.perf_counter()
    except GaveUp as exc:
        _fail(out, i, str(exc))
    finally:
        await conn.close()


async def measure(
    dsn: str,
    steps: int,
    gpus: int,
    *,
    holds_s: tuple[float, float] = (1.0, 3.0),
    time_scale: float = 1.0,
    workers: int | None = None,
    run_for: float | None = None,
    retry_for: float = RETRY_FOR,
) -> SweepResult:
    holds = trace(steps, *holds_s, time_scale)
    ideal = ideal_starts(holds, gpus)
    ideal_s = max(s + h for s, h in zip(ideal, holds, strict=True))
    budget = run_for if run_for is not None else retry_for + 5 * ideal_s + 120
    _raise_fd_limit(steps + 1000)
    conn = await common.bench_connect(dsn)
    counts: Counter[str] = Counter()
    out: dict[str, Any] = {
        "submitted": [0.0] * steps,
        "granted": [0.0] * steps,
        "released": [0.0] * steps,
        "polls": 0,
        "counts": counts,
        "retry_for": retry_for,
        "failed": 0,
        "problems": [],
    }
    timed_out = False
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
        options = ("--workers", str(workers)) if workers is not None else ()
        with serve(dsn, reconciler=True, env=env, options=options) as url:
            opening = asyncio.Semaphore(OPENING)
            started = time.perf_counter()
            tasks = [
                asyncio.create_task(_step(url, i, h, opening, out)) for i, h in enumerate(holds)
            ]
            _done, pending = await asyncio.wait(tasks, timeout=budget)
            if pending:
                timed_out = True
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                out["failed"] += len(pending)
                out["problems"].insert(
                    0, f"run timed out after {budget:.0f} s: {len(pending):,} steps unfinished"
                )
            for task in tasks:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            # Until the last release answered (or the run was cut off).
            ended = time.perf_counter() if timed_out or out["failed"] else max(out["released"])
            makespan = ended - started
        sent = [t for t in out["submitted"] if t]
        submitted = (max(sent) - started) if sent else float("nan")
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
        if await common.broken_invariants(conn):
            problems.append("invariant violations")
    finally:
        await conn.close()
    setup = (steps, gpus, holds_s, time_scale, workers)  # the fields of the run asked for
    result = SweepResult(
        *setup,
        makespan_s=makespan,
        ideal_s=ideal_s,
        submitted_s=submitted,
        grant_lag_p50_ms=percentile(lags, 50) * 1000 if lags else float("nan"),
        grant_lag_p99_ms=percentile(lags, 99) * 1000 if lags else float("nan"),
        polls=out["polls"],
        answers_503=counts["503"],
        answers_429=counts["429"],
        transport_errors=counts["transport"],
        failed_steps=out["failed"],
        timed_out=timed_out,
        **checked(problems),
    )
    log(
        f"  sweep: {steps:,} steps on {gpus:,} GPUs: makespan {makespan:.1f} s, ideal "
        f"{ideal_s:.1f} s ({result.ratio:.2f} ×); all creates sent after {submitted:.1f} s; "
        f"{counts['503']:,} × 503, {counts['429']:,} × 429, {out['failed']:,} failed steps; "
        f"correct: {result.correct}"
    )
    return result


def _holds(text: str) -> tuple[float, float]:
    low, sep, high = text.partition("-")
    try:
        pair = (float(low), float(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--holds: {text!r} is not LOW-HIGH seconds") from None
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"--holds: {text!r} needs 0 < LOW <= HIGH")
    return pair


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dsn_argument(parser)
    parser.add_argument("--steps", type=int, default=10_000, help="steps (10000)")
    parser.add_argument("--gpus", type=int, default=1000, help="GPUs in the pool (1000)")
    parser.add_argument(
        "--holds",
        type=_holds,
        default=(1.0, 3.0),
        metavar="LOW-HIGH",
        help="each step holds a time drawn uniformly from LOW..HIGH seconds (1-3)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="wall seconds per second of hold: --holds 30-300 --time-scale 0.05 holds "
        "1.5-15 s; the ideal uses the same compressed holds (1)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="passed to respool serve as --workers N (when this checkout's serve has it)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds before unfinished steps are counted failed and the run ends "
        "(default: 600 s of retries + 5 × the ideal makespan + 120 s)",
    )


async def _run(args: argparse.Namespace) -> SweepResult:
    await common.durable_server(args.dsn)
    async with common.fresh_database(args.dsn) as dsn:
        return await measure(
            dsn,
            args.steps,
            args.gpus,
            holds_s=args.holds,
            time_scale=args.time_scale,
            workers=args.workers,
            run_for=args.timeout,
        )


def run(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.gpus < 1:
        raise SystemExit("--steps and --gpus must be >= 1")
    if not 0 < args.time_scale <= 1000:
        raise SystemExit("--time-scale must be > 0 and <= 1000")
    if args.timeout is not None and args.timeout <= 0:
        raise SystemExit("--timeout must be > 0")
    if args.workers is not None:
        if args.workers < 1:
            raise SystemExit("--workers must be >= 1")
        if not serve_has_option("--workers"):
            log(
                "  sweep: this checkout's `respool serve` has no --workers option: "
                f"--workers {args.workers} ignored, one API process"
            )
            args.workers = None
    r = asyncio.run(_run(args))
    verdict = "yes" if r.correct else "NO: " + "; ".join(r.problems[:3])
    low, high = r.holds_s
    scale = ""
    if r.time_scale != 1:
        scale = f" × {r.time_scale:g} = {low * r.time_scale:g}–{high * r.time_scale:g} s"
    return report(
        r,
        [
            "steps",
            "GPUs",
            "holds",
            "API processes",
            "makespan",
            "ideal",
            "ratio",
            "all creates sent after",
            "grant lag p50 / p99",
            "long-polls after create",
            "503 / 429 answers",
            "failed steps",
            "correct",
        ],
        [
            [
                f"{r.steps:,}",
                f"{r.gpus:,}",
                f"{low:g}–{high:g} s{scale}",
                str(r.workers or 1),
                f"{r.makespan_s:.1f} s",
                f"{r.ideal_s:.1f} s",
                f"{r.ratio:.2f}",
                f"{r.submitted_s:.1f} s",
                f"{r.grant_lag_p50_ms:,.0f} / {r.grant_lag_p99_ms:,.0f} ms",
                f"{r.polls:,}",
                f"{r.answers_503:,} / {r.answers_429:,}",
                f"{r.failed_steps:,}" + (" (timed out)" if r.timed_out else ""),
                verdict,
            ]
        ],
    )
