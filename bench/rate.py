"""Scenario ``rate``: rate keys (docs/rates.md) through HTTP, three phases on one ``respool serve``
(reconciler on) and a fresh database.

1. **Throughput.** A pool whose budget never runs out (``llm_tokens``: 10^15 per 60 s);
   ``--callers`` (default 200) keep-alive connections each reserve (``POST /v1/requests``,
   granted in its create) and settle (``POST …/release`` with ``{"used": …}``) in a loop for
   ``--seconds``. Reported: reservations/s (granted creates) and full reserve-and-settle cycles/s,
   next to the baseline: the same loop first, on a pool where ``llm_tokens`` is an ordinary key,
   released without ``used``.
2. **A saturated window.** ``--amount`` tokens per ``--window`` seconds (a short window, so that a
   run sees many of them); every caller asks for ``--estimate`` tokens and waits for its grant
   (``?wait=25``), then settles a use drawn around the estimate: most below it (a refund), one in
   ten above it (an extra charge). Reported per window of the run after the first: the budget
   used (the settled amounts) over the amount, the same counting each charge at most at its
   estimate (what admission decided, invariant I10: never above 100 %), and the overrun (units
   settled above their estimates), plus ``invariant_violations``.
   Where a cycle's CPU goes, measured over the same loop: the bench process (its callers), the
   ``respool serve`` process with its children, and the database's backends of the bench
   database (``/proc``; a database on another machine: not measured), each in CPU milliseconds
   per cycle. And the engine's own share, without HTTP: one connection creating batches of 50
   reservations of four teams interleaved (``respool.create_requests_each``, what the API makes
   of concurrent creates) and releasing them with their settlements
   (``respool.release_requests``), its backend's CPU per reservation.
3. **Refill delay.** The same window, settlements equal to the estimates (so a grant can only
   come from a charge leaving the window): for each grant made while callers waited, the time
   from the instant the last charge before it left the window to the grant, by the database's
   clock (the grant's charge instant), and to the caller's answer (its wall clock, same machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec

from app.db.named import query
from bench.common import (
    Figures,
    add_dsn_argument,
    bench_connect,
    durable_server,
    fresh_database,
    log,
    report,
)
from bench.rawhttp import Connection, split_url
from bench.waiters import _raise_fd_limit
from bench.wake import serve_process

SUMMARY = "rate keys: reservations/s, budget used of a saturated window, refill-to-grant delay"


@dataclass(frozen=True)
class RateResult(Figures):
    callers: int
    reservations_per_s: float
    cycles_per_s: float
    baseline_cycles_per_s: float  # the same loop on an ordinary key, released without used
    cpu_ms_bench: float  # CPU per reserve-and-settle cycle: the bench process (its callers)
    cpu_ms_serve: float  # the respool serve process and its children
    cpu_ms_database: float  # the database's backends of the bench database (nan: not local)
    engine_ms_create: float  # the engine alone, one connection: a coalesced create, per member
    engine_ms_release: float  # and a coalesced release with its settlement, per member
    window_s: int
    amount: int
    estimate: int
    windows: int
    used_pct_mean: float  # settled amounts inside a window / amount
    used_pct_min: float
    admitted_pct_max: float  # charges at most at their estimates / amount (never above 100)
    admitted_pct_mean: float
    overrun_units: int
    overrun_pct_of_amount_max: float
    grants_waited: int
    delay_db_p50_ms: float
    delay_db_p95_ms: float
    delay_client_p50_ms: float
    delay_client_p95_ms: float
    violations: int


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _setup(
    dsn: str, name: str, amount: int, window: int, subjects: int, *, rate: bool = True
) -> None:
    """Pool ``name`` with ``llm_tokens`` as a rate key (or, ``rate=False``, as an ordinary key
    of that capacity: the baseline) and policies for ``subjects`` subjects."""
    conn = await bench_connect(dsn)
    try:
        if rate:
            await conn.execute(
                "SELECT respool.create_pool(p_name => $1, p_rates => $2)",
                name,
                {"llm_tokens": {"amount": amount, "per_seconds": window}},
            )
        else:
            await conn.execute(
                "SELECT respool.create_pool(p_name => $1, p_capacity => $2)",
                name,
                {"llm_tokens": amount},
            )
        for i in range(subjects):
            await conn.execute(
                "SELECT respool.create_policy(p_subject => $1, p_pool => $2)", f"team-{i}", name
            )
    finally:
        await conn.close()


class _Caller:
    """One keep-alive connection reserving and settling in a loop."""

    def __init__(self, url: str, pool: str, subject: str, estimate: int) -> None:
        self.url, self.pool, self.subject, self.estimate = url, pool, subject, estimate
        self.conn: Connection | None = None
        self.granted = 0
        self.cycles = 0
        self.answers: dict[str, float] = {}  # request id -> wall clock of its granted answer

    async def open(self) -> None:
        self.conn = await Connection(*split_url(self.url)).open()

    async def loop(self, until: float, used: Any, wait: bool) -> None:
        assert self.conn is not None
        body = msgspec.json.encode(
            {"subject": self.subject, "pool": self.pool, "resources": {"llm_tokens": self.estimate}}
        )
        target = "/v1/requests?wait=25" if wait else "/v1/requests"
        while time.monotonic() < until:
            reply = await self.conn.request("POST", target, body)
            if reply.status != 201:
                raise RuntimeError(f"create: {reply.status} {reply.body[:200]!r}")
            doc = msgspec.json.decode(reply.body)
            if doc["status"] != "allocated":
                with contextlib.suppress(Exception):
                    await self.conn.request("POST", f"/v1/requests/{doc['id']}/cancel")
                continue
            self.granted += 1
            self.answers[doc["id"]] = time.time()
            settle = None if used is None else {"used": {"llm_tokens": used(self.estimate)}}
            done = await self.conn.request(
                "POST",
                f"/v1/requests/{doc['id']}/release",
                None if settle is None else msgspec.json.encode(settle),
            )
            if done.status != 200:
                raise RuntimeError(f"release: {done.status} {done.body[:200]!r}")
            self.cycles += 1

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


async def _run_callers(
    url: str, pool: str, callers: int, estimate: int, seconds: float, used: Any, *, wait: bool
) -> tuple[list[_Caller], float]:
    crowd = [_Caller(url, pool, f"team-{i % 4}", estimate) for i in range(callers)]
    await asyncio.gather(*(c.open() for c in crowd))
    started = time.monotonic()
    try:
        await asyncio.gather(*(c.loop(started + seconds, used, wait) for c in crowd))
    finally:
        await asyncio.gather(*(c.close() for c in crowd))
    return crowd, time.monotonic() - started


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc``; 0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                found += [int(child), *_descendants(int(child))]
    return found


def _local_backends(pids: list[int]) -> list[int] | None:
    """``pids`` when each is a PostgreSQL process of this machine; None for a server on another
    machine (its backends are not ours to read)."""
    local = []
    for pid in pids:
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"postgres"):
                return None
        except OSError:
            continue  # (a backend that ended meanwhile)
        local.append(pid)
    return local or None


class _CpuMeter:
    """CPU seconds spent by this process, a serve process (with its children) and the
    database's backends of one database, between :meth:`start` and :meth:`stop`."""

    def __init__(self, dsn: str, serve_pid: int) -> None:
        self.dsn, self.serve_pid = dsn, serve_pid
        self.spent: dict[str, float] = {}

    async def _backends(self) -> list[int] | None:
        conn = await bench_connect(self.dsn)
        try:
            pids = [
                int(r[0])
                for r in await conn.fetch(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ]
        finally:
            await conn.close()
        return _local_backends(pids)

    def _now(self, backends: list[int] | None) -> dict[str, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        serving = [self.serve_pid, *_descendants(self.serve_pid)]
        return {
            "bench": own.ru_utime + own.ru_stime,
            "serve": sum(_cpu_seconds(p) for p in serving),
            "database": math.nan if backends is None else sum(_cpu_seconds(p) for p in backends),
        }

    async def start(self) -> None:
        self._start = self._now(await self._backends())

    async def stop(self) -> None:
        # (the backends now: the pool may have opened more; each new one started at 0)
        end = self._now(await self._backends())
        self.spent = {k: end[k] - self._start[k] for k in end}


async def _engine_alone(dsn: str, pool: str, rounds: int = 20, batch: int = 50) -> dict[str, float]:
    """The engine's CPU per member of a coalesced create and of a coalesced release with its
    settlement (four teams interleaved, ``batch`` a call), by the backend of one connection;
    nan for a database on another machine."""
    conn = await bench_connect(dsn)
    try:
        backend = _local_backends([int(await conn.fetchval("SELECT pg_backend_pid()"))])
        spent = {"create": 0.0, "release": 0.0}
        for _ in range(rounds):
            members = [
                {"subject": f"team-{i % 4}", "pool": pool, "resources": {"llm_tokens": 1000}}
                for i in range(batch)
            ]
            before = _cpu_seconds(backend[0]) if backend else 0.0
            rows = await conn.fetch(query("create_requests_each"), members, None)
            middle = _cpu_seconds(backend[0]) if backend else 0.0
            ids = [UUID(r["request"]["id"]) for r in rows if r["request"] is not None]
            await conn.fetch(
                query("release_requests"), ids, [None] * len(ids), [{"llm_tokens": 700}] * len(ids)
            )
            spent["create"] += middle - before
            spent["release"] += (_cpu_seconds(backend[0]) if backend else 0.0) - middle
    finally:
        await conn.close()
    if not backend:
        return {"create": math.nan, "release": math.nan}
    return {k: 1000 * v / (rounds * batch) for k, v in spent.items()}


async def _windows(dsn: str, pool: str, window: int, amount: int) -> dict[str, float]:
    """Budget use per tumbling window of the run after its first (and before its last)."""
    conn = await bench_connect(dsn)
    try:
        rows = await conn.fetch(
            """
            WITH span AS (SELECT min(at) AS t0, max(at) AS t1 FROM respool.rate_charge_history
                           WHERE pool = $1),
            w AS (SELECT generate_series(1, floor(extract(epoch FROM t1 - t0) / $2)::int - 1) AS k,
                         t0 FROM span)
            SELECT w.k, sum(c.amount) AS used, sum(least(c.amount, c.estimate)) AS admitted,
                   sum(greatest(c.amount - c.estimate, 0)) AS overrun
              FROM w JOIN respool.rate_charge_history c
                ON c.pool = $1 AND c.at >= w.t0 + make_interval(secs => w.k * $2)
               AND c.at < w.t0 + make_interval(secs => (w.k + 1) * $2)
             GROUP BY w.k ORDER BY w.k
            """,
            pool,
            window,
        )
        violations = await conn.fetchval("SELECT count(*) FROM respool.invariant_violations")
    finally:
        await conn.close()
    used = [100.0 * float(r["used"]) / amount for r in rows]
    admitted = [100.0 * float(r["admitted"]) / amount for r in rows]
    over = [int(r["overrun"]) for r in rows]
    return {
        "windows": len(rows),
        "used_mean": statistics.fmean(used) if used else float("nan"),
        "used_min": min(used, default=float("nan")),
        "admitted_max": max(admitted, default=float("nan")),
        "admitted_mean": statistics.fmean(admitted) if admitted else float("nan"),
        "overrun": sum(over),
        "overrun_max_pct": 100.0 * max(over, default=0) / amount,
        "violations": int(violations),
    }


async def _delays(dsn: str, pool: str, window: int, crowd: list[_Caller]) -> dict[str, Any]:
    """Per grant made while its caller waited: from the last charge leaving the window before
    the grant's own charge, to that charge (database clock) and to the caller's answer."""
    answered = {rid: wall for c in crowd for rid, wall in c.answers.items()}
    conn = await bench_connect(dsn)
    try:
        # (a grant that waited: its charge is more than 5 ms after its request was created)
        rows = await conn.fetch(
            """
            SELECT g.request_id::text AS id, extract(epoch FROM g.at) AS granted,
                   extract(epoch FROM (SELECT max(c.at) FROM respool.rate_charge_history c
                                        WHERE c.pool = $1
                                          AND c.at + make_interval(secs => $2) <= g.at)
                                     + make_interval(secs => $2)) AS left_at
              FROM respool.rate_charge_history g JOIN respool.requests r ON r.id = g.request_id
             WHERE g.pool = $1 AND g.at > r.created_at + interval '5 ms'
            """,
            pool,
            window,
        )
    finally:
        await conn.close()
    timed = [r for r in rows if r["left_at"] is not None]
    db_ms = [1000 * float(r["granted"] - r["left_at"]) for r in timed]
    client_ms = [
        1000 * (answered[r["id"]] - float(r["left_at"])) for r in timed if r["id"] in answered
    ]
    return {"n": len(db_ms), "db": db_ms, "client": client_ms}


async def measure(dsn: str, args: argparse.Namespace) -> RateResult:
    _raise_fd_limit(args.callers + 1000)
    big = 10**15
    await _setup(dsn, "open", big, 60, 4)
    await _setup(dsn, "plain", big, 60, 4, rate=False)
    await _setup(dsn, "tight", args.amount, args.window, 4)
    await _setup(dsn, "exact", args.amount, args.window, 4)
    await _setup(dsn, "engine", big, 60, 4)
    engine = await _engine_alone(dsn, "engine")
    log(
        f"  the engine alone (one connection, batches of 50): {engine['create']:.2f} ms CPU per"
        f" create, {engine['release']:.2f} ms per release with its settlement"
    )
    env = {"RESPOOL_MAX_CONNECTIONS": str(args.callers + 1000)}
    rng = random.Random(7)

    def around(estimate: int) -> int:  # nine in ten below the estimate, one in ten above it
        return int(
            estimate * (rng.uniform(0.5, 1.0) if rng.random() < 0.9 else rng.uniform(1.0, 1.2))
        )

    with serve_process(dsn, reconciler=True, env=env) as (url, proc):
        base, base_took = await _run_callers(
            url, "plain", args.callers, 1000, args.seconds, None, wait=False
        )
        baseline = sum(c.cycles for c in base) / base_took
        log(f"  baseline (an ordinary key, no settlement): {baseline:,.0f} cycles/s")
        meter = _CpuMeter(dsn, proc.pid)
        await meter.start()
        crowd, took = await _run_callers(
            url, "open", args.callers, 1000, args.seconds, lambda e: e * 7 // 10, wait=False
        )
        await meter.stop()
        granted = sum(c.granted for c in crowd)
        cycles = sum(c.cycles for c in crowd)
        cpu = {k: 1000 * v / max(cycles, 1) for k, v in meter.spent.items()}
        log(f"  throughput: {granted / took:,.0f} reservations/s, {cycles / took:,.0f} cycles/s")
        log(
            f"  CPU ms per cycle: bench {cpu['bench']:.2f}, serve {cpu['serve']:.2f},"
            f" database {cpu['database']:.2f}"
        )
        await _run_callers(
            url, "tight", args.callers, args.estimate, args.saturated_seconds, around, wait=True
        )
        use = await _windows(dsn, "tight", args.window, args.amount)
        log(f"  saturated: {use}")
        crowd3, _ = await _run_callers(
            url, "exact", args.callers, args.estimate, args.saturated_seconds, lambda e: e,
            wait=True,
        )  # fmt: skip
    delays = await _delays(dsn, "exact", args.window, crowd3)
    log(f"  refill delay: {delays['n']} grants after a wait")
    return RateResult(
        callers=args.callers,
        reservations_per_s=granted / took,
        cycles_per_s=cycles / took,
        baseline_cycles_per_s=baseline,
        cpu_ms_bench=cpu["bench"],
        cpu_ms_serve=cpu["serve"],
        cpu_ms_database=cpu["database"],
        engine_ms_create=engine["create"],
        engine_ms_release=engine["release"],
        window_s=args.window,
        amount=args.amount,
        estimate=args.estimate,
        windows=int(use["windows"]),
        used_pct_mean=use["used_mean"],
        used_pct_min=use["used_min"],
        admitted_pct_max=use["admitted_max"],
        admitted_pct_mean=use["admitted_mean"],
        overrun_units=int(use["overrun"]),
        overrun_pct_of_amount_max=use["overrun_max_pct"],
        grants_waited=delays["n"],
        delay_db_p50_ms=_pct(delays["db"], 0.5),
        delay_db_p95_ms=_pct(delays["db"], 0.95),
        delay_client_p50_ms=_pct(delays["client"], 0.5),
        delay_client_p95_ms=_pct(delays["client"], 0.95),
        violations=int(use["violations"]),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dsn_argument(parser)
    parser.add_argument("--callers", type=int, default=200, help="concurrent callers (200)")
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput phase (10 s)")
    parser.add_argument(
        "--saturated-seconds", type=float, default=15.0, help="each saturated phase (15 s)"
    )
    parser.add_argument("--window", type=int, default=3, help="per_seconds of the budget (3)")
    parser.add_argument("--amount", type=int, default=30_000, help="tokens per window (30000)")
    parser.add_argument("--estimate", type=int, default=1000, help="tokens per reservation (1000)")


async def _run(args: argparse.Namespace) -> RateResult:
    await durable_server(args.dsn)
    async with fresh_database(args.dsn) as dsn:
        return await measure(dsn, args)


def run(args: argparse.Namespace) -> int:
    if args.callers < 1 or args.seconds <= 0 or args.saturated_seconds < 3 * args.window:
        raise SystemExit("--callers >= 1, --seconds > 0, --saturated-seconds >= 3 windows")
    if not 1 <= args.window <= 86_400 or args.amount < args.estimate or args.estimate < 1:
        raise SystemExit("--window 1..86400, 1 <= --estimate <= --amount")
    r = asyncio.run(_run(args))
    return report(
        r,
        [
            "callers",
            "reservations/s",
            "reserve+settle cycles/s",
            "baseline cycles/s (ordinary key)",
            "CPU ms per cycle: bench / serve / database",
            "engine alone, CPU ms per create / release",
            "window",
            "budget used per window (mean, min)",
            "admitted per window (max, never above 100 %)",
            "overrun (units, max % of amount)",
            "refill → grant p50 / p95 (database)",
            "refill → caller's answer p50 / p95",
            "violations",
        ],
        [
            [
                r.callers,
                f"{r.reservations_per_s:,.0f}",
                f"{r.cycles_per_s:,.0f}",
                f"{r.baseline_cycles_per_s:,.0f}",
                f"{r.cpu_ms_bench:.2f} / {r.cpu_ms_serve:.2f} / {r.cpu_ms_database:.2f}",
                f"{r.engine_ms_create:.2f} / {r.engine_ms_release:.2f}",
                f"{r.window_s} s, {r.amount:,} / {r.estimate:,} per call",
                f"{r.used_pct_mean:.1f} %, {r.used_pct_min:.1f} % ({r.windows} windows)",
                f"{r.admitted_pct_max:.1f} %",
                f"{r.overrun_units:,}, {r.overrun_pct_of_amount_max:.1f} %",
                f"{r.delay_db_p50_ms:.0f} / {r.delay_db_p95_ms:.0f} ms ({r.grants_waited} grants)",
                f"{r.delay_client_p50_ms:.0f} / {r.delay_client_p95_ms:.0f} ms",
                r.violations,
            ]
        ],
    )
