"""``python -m bench dashboard``: the dashboard and the request list against the queue size.

Before it was fixed, the dashboard re-ran a pool's whole queue order once per queue entry, and
``GET /v1/requests`` recomputed each queued request's position on its own, so both grew with the
square of the queue. This fills one pool (full, 64 holders) with ``--queued`` waiting requests in
four shapes (the reconcile scenario's ``fill``, bulk copies) and times, from the client:

* ``dashboard``: :func:`app.db.dashboard.dashboard_data` (what ``GET /v1/dashboard`` reads);
* ``requests``: :func:`app.db.db_requests.list_requests` with ``limit=1000`` (``GET /v1/requests``),
  and the same with ``status=queued``;
* ``HTTP GET …``: both endpoints of a ``respool serve`` process, answers read whole;
* ``request #N``: :func:`app.db.db_requests.get_request` (``GET /v1/requests/{id}``) of the queued
  request at position N: the head, the 100th (the last one with an ETA, ``_eta_depth()``) and the
  last one of the queue.

The pool also gets 500 recorded holds (released requests of 60-600 s, created a day earlier, so
they are on no page), so that every queued request within ``_eta_depth()`` of the head gets an ETA
(docs/scheduling.md, "ETA") computed as in production, not skipped for want of history.

Target: each under 100 ms at 10,000 queued.

``--tails``: instead, the dashboard with 20 running jobs whose current attempt holds the whole
``RESPOOL_LOG_LIMIT`` (1 MiB) of output, in 32 KiB chunks of 80-character lines and in one-line
chunks (the two shapes the agent sends), against no running job: what the jobs' output tails
(``respool.job_log_tail``) add to each poll.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from app.db import dashboard as db_dashboard
from app.db import requests as db_requests
from bench.common import Spread, bench_connect, fresh_database, log, log_medians
from bench.reconcile import fill
from bench.wake import serve

HISTORY_SQL = """
INSERT INTO respool.requests (subject, pool_ref, pool_id, pool_name, policy_id, candidate_pool_ids,
                              resources, preemptible, priority, status, message, max_retries,
                              request_body, labels, queued_at, created_at, updated_at,
                              allocated_at, finished_at)
SELECT s.subject, s.pool_ref, s.pool_id, s.pool_name, s.policy_id, s.candidate_pool_ids,
       s.resources, s.preemptible, s.priority, 'released', '', s.max_retries, s.request_body,
       s.labels, t.start, t.start, t.start + t.hold, t.start, t.start + t.hold
  FROM (SELECT * FROM respool.requests WHERE status = 'allocated' ORDER BY created_at LIMIT 1) s,
       LATERAL (SELECT now() - interval '1 day' + g * interval '1 minute' AS start,
                       (60 + (g * 37) % 540) * interval '1 second' AS hold
                  FROM generate_series(1, 500) g) t
"""
POSITIONS_SQL = """
SELECT o.position, o.request_id
  FROM respool.pools pl CROSS JOIN LATERAL respool._queue_order(pl.id) o
 WHERE o.position IN (1, 100) OR o.position = (SELECT count(*) FROM respool.queue_entries)
 ORDER BY o.position
"""
SUMMARY = "GET /v1/dashboard and GET /v1/requests?limit=1000 against the queue size"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queued",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[2000, 10_000],
        help="queue sizes, comma-separated (default 2000,10000)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per figure")
    parser.add_argument(
        "--dsn",
        default=DEFAULT_DSN,
        help="a PostgreSQL server where we may CREATE DATABASE (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--tails", action="store_true", help="time the running jobs' output tails instead"
    )


async def _time(rounds: int, call: Callable[[], Awaitable[Any]]) -> Spread:
    await call()  # warm the plans up
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return Spread.of(times)


async def _over_http(dsn: str, rounds: int) -> dict[str, Spread]:
    """The same reads over HTTP: the endpoints of ``respool serve``, each answer read whole."""

    def get(http: httpx.AsyncClient, path: str) -> Callable[[], Awaitable[Any]]:
        async def call() -> None:
            (await http.get(path)).raise_for_status()

        return call

    with serve(dsn) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            return {
                "HTTP GET /v1/dashboard": await _time(rounds, get(http, "/v1/dashboard")),
                "HTTP GET /v1/requests?limit=1000": await _time(
                    rounds, get(http, "/v1/requests?limit=1000")
                ),
            }


async def measure_one(admin_dsn: str, queued: int, rounds: int) -> dict[str, Spread]:
    async with fresh_database(admin_dsn) as dsn:
        conn = await bench_connect(dsn)
        try:
            started = time.perf_counter()
            await fill(conn, queued, 1)
            await conn.execute(HISTORY_SQL)
            log(f"  dashboard: {queued} queued, filled in {time.perf_counter() - started:.1f} s")
            reads = {row[0]: row[1] for row in await conn.fetch(POSITIONS_SQL)}
            figures = {
                "dashboard": await _time(rounds, lambda: db_dashboard.dashboard_data(conn)),
                "requests limit=1000": await _time(
                    rounds, lambda: db_requests.list_requests(conn, limit=1000)
                ),
                "requests status=queued limit=1000": await _time(
                    rounds, lambda: db_requests.list_requests(conn, status="queued", limit=1000)
                ),
            }
            for position, request_id in reads.items():
                figures[f"request #{position}"] = await _time(
                    rounds, functools.partial(db_requests.get_request, conn, request_id)
                )
            figures |= await _over_http(dsn, rounds)
        finally:
            await conn.close()
    log_medians(f"  dashboard: {queued} queued", figures, 1)
    return figures


TAIL_JOBS = 20
LOG_LIMIT = 1_048_576
LINE = "x" * 79 + "\n"


async def _jobs_with_output(conn: Any, chunk_lines: int) -> None:
    """:data:`TAIL_JOBS` running jobs, each with :data:`LOG_LIMIT` bytes of output stored in
    chunks of ``chunk_lines`` lines (as the agent sends them: respool.append_job_log)."""
    await conn.execute("SELECT respool.create_pool('tails', $1::jsonb)", {"slot": TAIL_JOBS})
    await conn.execute("SELECT respool.create_policy('bench', 'tails')")
    body = {"subject": "bench", "pool": "tails", "resources": {"slot": 1},
            "job": {"command": ["train"]}}  # fmt: skip
    chunk = LINE * chunk_lines
    for _ in range(TAIL_JOBS):
        doc = await conn.fetchval("SELECT request FROM respool.create_request($1::jsonb)", body)
        await conn.execute(
            "SELECT respool.append_job_log($1::uuid, 1, g, 'stdout', $2, $3)"
            " FROM generate_series(0, $4 - 1) g",
            doc["id"], chunk, LOG_LIMIT, LOG_LIMIT // len(chunk) + 1,
        )  # fmt: skip


async def measure_tails(admin_dsn: str, rounds: int) -> dict[str, Spread]:
    figures: dict[str, Spread] = {}
    for label, chunk_lines in (("no running job", 0), ("32 KiB chunks", 409), ("1-line chunks", 1)):
        async with fresh_database(admin_dsn) as dsn:
            conn = await bench_connect(dsn)
            try:
                if chunk_lines:
                    await _jobs_with_output(conn, chunk_lines)
                    label = f"{TAIL_JOBS} jobs x 1 MiB, {label}"
                figures[f"dashboard, {label}"] = await _time(
                    rounds, functools.partial(db_dashboard.dashboard_data, conn)
                )
            finally:
                await conn.close()
    log_medians("  dashboard tails", figures, 1)
    return figures


async def _run(args: argparse.Namespace) -> dict[int, dict[str, Spread]]:
    if args.tails:
        return {0: await measure_tails(args.dsn, args.rounds)}
    return {q: await measure_one(args.dsn, q, args.rounds) for q in args.queued}


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1 or any(q < 4 for q in args.queued):
        raise SystemExit("--rounds must be >= 1 and every --queued >= 4")
    result = asyncio.run(_run(args))
    if args.json:
        print(
            json.dumps({str(q): {k: s.as_dict() for k, s in f.items()} for q, f in result.items()})
        )
        return 0
    print(f"respool dashboard and request list: median (low-high) ms of {args.rounds} calls")
    for q, figures in result.items():
        for name, spread in figures.items():
            print(f"  {q:>6} queued  {name:<34} {spread.fmt(1)} ms")
    return 0
