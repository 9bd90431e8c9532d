"""Scenario ``burst``: many concurrent creates at once on an API with a small database pool.

A fresh database, a pool big enough for every create (each is granted in its create), one
``respool serve`` with ``RESPOOL_DB_POOL_SIZE=--db-pool`` (default 5) and the reconciler on.
``--creates`` creates (default 3,000) are sent at the same moment through one httpx client
limited to ``--connections`` keep-alive connections (default 300), each with an idempotency
key. Every answer is counted by its status code, every transport error (a connection closed
under a request: httpx ``ReadError``, ``RemoteProtocolError``, …) by its kind; a 429 or 503 is
retried after its ``Retry-After`` (else a jittered backoff) and a transport error after a
backoff, for up to 600 s, as respool-client does. Reported: the time until every create had
its final answer, the counts, and creates that never got one. Afterwards each create must
exist exactly once, granted, with no invariant broken.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from bench.common import (
    Figures,
    add_dsn_argument,
    bench_connect,
    durable_server,
    fresh_database,
    log,
    report,
)
from bench.retrying import BACKOFF_BASE, BACKOFF_MAX, RETRIED, RETRY_FOR
from bench.waiters import _raise_fd_limit
from bench.wake import serve

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


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return max(0.0, float(resp.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


async def _create(
    http: httpx.AsyncClient,
    i: int,
    statuses: Counter[str],
    errors: Counter[str],
    problems: list[str],
) -> bool:
    """One create, retried like the client; whether it got a final (non-retried) answer."""
    body = {
        "subject": "burst",
        "pool": "burst",
        "resources": {"gpu": 1},
        "idempotency_key": f"burst-{i}",
    }
    give_up = time.monotonic() + RETRY_FOR
    attempt = 0
    while True:
        wait: float | None = None
        try:
            resp = await http.post("/v1/requests", json=body)
        except httpx.TransportError as exc:
            errors[type(exc).__name__] += 1
            problem = f"{type(exc).__name__}: {exc}"
        else:
            statuses[str(resp.status_code)] += 1
            if resp.status_code not in RETRIED:
                if resp.status_code not in (200, 201):
                    problems.append(f"create {i}: {resp.status_code} {resp.text[:200]}")
                return True
            problem = f"HTTP {resp.status_code}"
            wait = _retry_after(resp)
        left = give_up - time.monotonic()
        if left <= 0:
            problems.append(f"create {i}: gave up after {attempt + 1} tries: {problem}")
            return False
        if wait is None:
            step = min(BACKOFF_MAX, BACKOFF_BASE * 2.0**attempt)
            wait = step * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not crypto
        attempt += 1
        await asyncio.sleep(min(wait, left))


async def measure(dsn: str, creates: int, connections: int, db_pool: int) -> BurstResult:
    _raise_fd_limit(connections + 1000)
    conn = await bench_connect(dsn)
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    problems: list[str] = []
    try:
        await conn.execute(
            "SELECT respool.create_pool(p_name => 'burst', p_capacity => $1)", {"gpu": creates}
        )
        await conn.execute("SELECT respool.create_policy(p_subject => 'burst', p_pool => 'burst')")
        env = {"RESPOOL_DB_POOL_SIZE": str(db_pool)}
        with serve(dsn, reconciler=True, env=env) as url:
            limits = httpx.Limits(
                max_connections=connections, max_keepalive_connections=connections
            )
            # No pool timeout: a create waits for one of the connections as long as it takes.
            timeout = httpx.Timeout(120.0, pool=None)
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:
                started = time.perf_counter()
                answered = await asyncio.gather(
                    *(_create(http, i, statuses, errors, problems) for i in range(creates))
                )
                answered_s = time.perf_counter() - started
        unanswered = answered.count(False)
        row = await conn.fetchrow(
            "SELECT count(*) AS n, count(DISTINCT idempotency_key) AS keys,"
            "       count(*) FILTER (WHERE status = 'allocated') AS allocated"
            "  FROM respool.requests"
        )
        assert row is not None
        if not row["n"] == row["keys"] == row["allocated"] == creates:
            problems.append(f"in the database: {dict(row)}")
        if await conn.fetchval("SELECT count(*) FROM respool.invariant_violations"):
            problems.append("invariant violations")
    finally:
        await conn.close()
    result = BurstResult(
        creates=creates,
        connections=connections,
        db_pool=db_pool,
        answered_s=answered_s,
        statuses=dict(sorted(statuses.items())),
        transport_errors=dict(sorted(errors.items())),
        unanswered=unanswered,
        correct=not problems,
        problems=tuple(problems[:20]),
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
    await durable_server(args.dsn)
    async with fresh_database(args.dsn) as dsn:
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
