"""Scenario ``burst``: many concurrent creates at once on an API with a small database pool.

A fresh database, a pool big enough for every create (each is granted in its create), one
``respool serve`` with ``RESPOOL_DB_POOL_SIZE=--db-pool`` (default 5) and the reconciler on.
``--connections`` keep-alive connections (default 300) are opened, then ``--creates`` creates
(default 3,000, each with an idempotency key) are sent over them at once: each connection sends
its next create as soon as its last one is answered, so every connection has a create in flight
until all are sent. (HTTP/1.1 carries one call at a time per connection. The load generator
speaks HTTP itself, bench/rawhttp.py: httpx's connection pool costs more CPU than the server
under test with thousands of calls waiting for its connections.) Every answer is counted by its
status code, every transport error (a connection closed or reset under a request, httpx's
``ReadError``) by its kind; a 429 or 503 is retried after its ``Retry-After`` (else a jittered
backoff) and a transport error by reopening the connection and sending the create again, for
up to 600 s, as respool-client does (bench/retrying.py). Reported: the time until every create
had its final answer, the counts, and creates that never got one. Afterwards each create must
exist exactly once, granted, with no invariant broken.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench import common
from bench.common import Figures, add_dsn_argument, checked, gpu_create, log, report
from bench.rawhttp import split_url
from bench.retrying import GaveUp, RetryingConnection
from bench.waiters import _raise_fd_limit
from bench.wake import serve

OPENING = 200  # connections opened at a time (the server's accept queue is finite)
SUMMARY = "a burst of concurrent creates on a small database pool: answers by status code"


@dataclass(frozen=True)
class BurstResult(Figures):
    creates: int
    connections: int
    db_pool: int
    answered_s: float
    statuses: dict[str, int]  # every answer, retried ones included
    transport_errors: dict[str, int]  # by httpx exception name
    unanswered: int  # creates still without a final answer after the retry budget
    correct: bool
    problems: tuple[str, ...]

    @property
    def answers_503(self) -> int:
        return self.statuses.get("503", 0)

    @property
    def answers_429(self) -> int:
        return self.statuses.get("429", 0)

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["answers_503"] = self.answers_503
        out["answers_429"] = self.answers_429
        return out


async def _open(url: str, counts: Counter[str], opening: asyncio.Semaphore) -> RetryingConnection:
    host, port = split_url(url)
    conn = RetryingConnection(host, port, counts)
    async with opening:
        with contextlib.suppress(OSError):  # refused: its first call retries it
            await conn.open()
    return conn


async def _connection(
    conn: RetryingConnection,
    numbers: itertools.count[int],
    total: int,
    statuses: Counter[str],
    problems: list[str],
) -> int:
    """One keep-alive connection sending creates until all are taken; how many of its
    creates never got a final answer."""
    lost = 0
    try:
        for i in itertools.takewhile(lambda i: i < total, numbers):
            body = gpu_create("burst", f"burst-{i}")
            try:
                reply = await conn.call("POST", "/v1/requests", body)
            except GaveUp as exc:
                lost += 1
                problems.append(f"create {i}: {exc}")
                continue
            statuses[str(reply.status)] += 1
            if reply.status not in (200, 201):
                problems.append(f"create {i}: {reply.status} {reply.body[:200]!r}")
    finally:
        await conn.close()
    return lost


async def measure(dsn: str, creates: int, connections: int, db_pool: int) -> BurstResult:
    _raise_fd_limit(connections + 1000)
    conn = await common.bench_connect(dsn)
    counts: Counter[str] = Counter()  # retried answers and transport errors
    statuses: Counter[str] = Counter()  # final answers
    problems: list[str] = []
    try:
        await conn.execute(
            "SELECT respool.create_pool(p_name => 'burst', p_capacity => $1)", {"gpu": creates}
        )
        await conn.execute("SELECT respool.create_policy(p_subject => 'burst', p_pool => 'burst')")
        env = {
            "RESPOOL_DB_POOL_SIZE": str(db_pool),
            "RESPOOL_MAX_CONNECTIONS": str(max(connections + 100, 20_000)),
        }
        with serve(dsn, reconciler=True, env=env) as url:
            opening = asyncio.Semaphore(OPENING)
            conns = await asyncio.gather(*(_open(url, counts, opening) for _ in range(connections)))
            numbers = itertools.count()
            started = time.perf_counter()
            lost = await asyncio.gather(
                *(_connection(c, numbers, creates, statuses, problems) for c in conns)
            )
            answered_s = time.perf_counter() - started
        unanswered = sum(lost)
        row = await conn.fetchrow(
            "SELECT count(*) AS n, count(DISTINCT idempotency_key) AS keys,"
            "       count(*) FILTER (WHERE status = 'allocated') AS allocated"
            "  FROM respool.requests"
        )
        assert row is not None
        if not row["n"] == row["keys"] == row["allocated"] == creates:
            problems.append(f"in the database: {dict(row)}")
        if await common.broken_invariants(conn):
            problems.append("invariant violations")
    finally:
        await conn.close()
    answers = statuses + Counter({k: n for k, n in counts.items() if k.isdigit()})
    result = BurstResult(
        creates=creates,
        connections=connections,
        db_pool=db_pool,
        answered_s=answered_s,
        statuses=dict(sorted(answers.items())),
        transport_errors={
            k.removeprefix("transport "): n
            for k, n in sorted(counts.items())
            if k.startswith("transport ")
        },
        unanswered=unanswered,
        **checked(problems),
    )
    log(
        f"  burst: {creates:,} creates over {connections} connections, database pool {db_pool}: "
        f"all answered after {answered_s:.1f} s; answers {result.statuses}; transport errors "
        f"{result.transport_errors or 0}; correct: {result.correct}"
    )
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dsn_argument(parser)
    parser.add_argument("--creates", type=int, default=3000, help="concurrent creates (3000)")
    parser.add_argument("--connections", type=int, default=300, help="keep-alive connections (300)")
    parser.add_argument("--db-pool", type=int, default=5, help="the API's RESPOOL_DB_POOL_SIZE (5)")


async def _run(args: argparse.Namespace) -> BurstResult:
    await common.durable_server(args.dsn)
    async with common.fresh_database(args.dsn) as dsn:
        return await measure(dsn, args.creates, args.connections, args.db_pool)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n:,} × {k}" for k, n in counts.items()) or "0"


def run(args: argparse.Namespace) -> int:
    if args.creates < 1 or args.connections < 1 or not 1 <= args.db_pool <= 1000:
        raise SystemExit("--creates and --connections must be >= 1, --db-pool 1..1000")
    r = asyncio.run(_run(args))
    verdict = "yes" if r.correct else "NO: " + "; ".join(r.problems[:3])
    return report(
        r,
        [
            "creates",
            "connections",
            "database pool",
            "all answered after",
            "answers (retried ones included)",
            "transport errors",
            "503 / 429",
            "never answered",
            "correct",
        ],
        [
            [
                f"{r.creates:,}",
                f"{r.connections:,}",
                str(r.db_pool),
                f"{r.answered_s:.1f} s",
                _counts(r.statuses),
                _counts(r.transport_errors),
                f"{r.answers_503:,} / {r.answers_429:,}",
                f"{r.unanswered:,}",
                verdict,
            ]
        ],
    )
