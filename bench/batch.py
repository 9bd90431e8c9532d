"""Scenario ``batch``: requests queued per second by batch create
(docs/scheduling.md, "Batch create").

A pool of one GPU held by one request, so every member queues (the costly case: each member
gets a queue entry and an exact queue position). ``--batches`` batches of ``--batch-size``
members are created one after another, first through ``respool.create_requests`` (the engine,
one asyncpg connection), then in a fresh database through ``POST /v1/requests/batch`` on one
``respool serve`` process. Rate = members queued ÷ wall time, per batch and overall. After
each path every member must be queued, in member order, with no invariant broken.

Then single creates: in a fresh database, the same setup, ``--clients`` concurrent HTTP clients
(default 200, each on one keep-alive connection of its own) send ``--singles`` single
``POST /v1/requests`` (default 10,000) to one ``respool serve``, each client its next create as
soon as the last one answered; the server may coalesce concurrent creates into one set-based
call. A 429 or 503 is retried after its ``Retry-After`` (bench/retrying.py). Rate = creates
queued ÷ wall time, compared with the HTTP batch rate of the same run. Afterwards every create
must be queued exactly once (its label and idempotency key once each), with no invariant broken.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx

from app.db import batch as db_batch
from bench import common
from bench.common import Figures, Spread, add_dsn_argument, gpu_create, gpu_members, log, report
from bench.rawhttp import split_url
from bench.retrying import GaveUp, RetryingConnection
from bench.wake import serve

SUMMARY = "requests/s queued by batch create (engine function and HTTP endpoint)"


@dataclass
class BatchResults(Figures):
    batches: int
    batch_size: int
    engine_per_batch: Spread
    engine_overall: float
    http_per_batch: Spread
    http_overall: float
    singles: int
    clients: int
    singles_per_s: float
    singles_over_batch: float
    singles_503: int
    singles_429: int


async def _setup(conn: asyncpg.Connection) -> None:
    await conn.execute("SELECT respool.create_pool(p_name => 'b', p_capacity => $1)", {"gpu": 1})
    await conn.execute("SELECT respool.create_policy(p_subject => 'b', p_pool => 'b')")
    await conn.execute(
        "SELECT created FROM respool.create_request(jsonb_build_object('subject', 'b',"
        " 'pool', 'b', 'resources', $1::jsonb))",
        {"gpu": 1},
    )


async def _check(conn: asyncpg.Connection, expected: int, *, in_order: bool = True) -> None:
    queued = await conn.fetchval("SELECT count(*) FROM respool.requests WHERE status = 'queued'")
    if queued != expected:
        raise SystemExit(f"batch: {queued} queued, expected {expected}")
    if not in_order:  # concurrent clients: no order between them to check
        if await common.broken_invariants(conn):
            raise SystemExit("batch: invariant violations")
        return
    disorder = await conn.fetchval(
        "SELECT count(*) FROM (SELECT position, labels, lag(created_at) OVER (ORDER BY position)"
        "   AS before, created_at FROM respool.queue q JOIN respool.requests r"
        "   ON r.id = q.request_id) x WHERE before > created_at"
    )
    if disorder:
        raise SystemExit(f"batch: {disorder} members out of queue order")
    if await common.broken_invariants(conn):
        raise SystemExit("batch: invariant violations")


# One way in: given the setup connection and the database, a function that creates one batch
# of members and answers how many requests it made.
Create = Callable[[list[dict[str, Any]]], Awaitable[int]]
BatchPath = Callable[[asyncpg.Connection, str], AbstractAsyncContextManager[Create]]


@contextlib.asynccontextmanager
async def _engine(conn: asyncpg.Connection, dsn: str) -> AsyncIterator[Create]:
    async def create(members: list[dict[str, Any]]) -> int:
        made = await db_batch.create_requests(conn, members, default_lease_seconds=300)
        return len(made)

    yield create


@contextlib.asynccontextmanager
async def _http(conn: asyncpg.Connection, dsn: str) -> AsyncIterator[Create]:
    with serve(dsn, reconciler=True) as url:
        async with httpx.AsyncClient(base_url=url, timeout=300) as http:

            async def create(members: list[dict[str, Any]]) -> int:
                r = await http.post("/v1/requests/batch", json={"members": members})
                if r.status_code != 201:
                    raise SystemExit(f"batch answered {r.status_code}: {r.text[:300]}")
                return len(r.json()["items"])

            yield create


async def _path(
    dsn: str, name: str, path: BatchPath, batches: int, batch_size: int
) -> tuple[list[float], float]:
    """Rates per batch and overall of ``batches`` batches created one after another."""
    conn = await common.bench_connect(dsn)
    try:
        await _setup(conn)
        rates: list[float] = []
        async with path(conn, dsn) as create:
            started = time.perf_counter()
            for k in range(batches):
                t0 = time.perf_counter()
                made = await create(gpu_members("b", batch_size, str(k)))
                rates.append(made / (time.perf_counter() - t0))
                log(f"  batch: {name} {k + 1}/{batches}: {rates[-1]:,.0f} requests/s")
            overall = batches * batch_size / (time.perf_counter() - started)
        await _check(conn, batches * batch_size)
    finally:
        await conn.close()
    return rates, overall


async def _single_client(
    url: str, numbers: itertools.count[int], total: int, counts: Counter[str]
) -> None:
    """One client: its own keep-alive connection, one single create after the other."""
    host, port = split_url(url)
    conn = RetryingConnection(host, port, counts)
    try:
        for i in itertools.takewhile(lambda i: i < total, numbers):
            body = gpu_create("b", f"single-{i}", labels={"member": f"single-{i}"})
            reply = await conn.call("POST", "/v1/requests", body)
            if reply.status not in (200, 201):
                raise SystemExit(f"single create answered {reply.status}: {reply.body[:300]!r}")
    except GaveUp as exc:
        raise SystemExit(f"single creates: {exc}") from None
    finally:
        await conn.close()


async def _singles(dsn: str, singles: int, clients: int) -> tuple[float, Counter[str]]:
    """Single creates per second from ``clients`` concurrent keep-alive clients."""
    conn = await common.bench_connect(dsn)
    counts: Counter[str] = Counter()
    try:
        await _setup(conn)
        with serve(dsn, reconciler=True) as url:
            numbers = itertools.count()
            started = time.perf_counter()
            await asyncio.gather(
                *(_single_client(url, numbers, singles, counts) for _ in range(clients))
            )
            rate = singles / (time.perf_counter() - started)
        log(
            f"  batch: {singles:,} single creates from {clients} clients: {rate:,.0f}/s "
            f"({counts['503']} × 503, {counts['429']} × 429 retried)"
        )
        await _check(conn, singles, in_order=False)
        row = await conn.fetchrow(
            "SELECT count(DISTINCT labels->>'member') AS members,"
            "       count(DISTINCT idempotency_key) AS keys"
            "  FROM respool.requests WHERE status = 'queued'"
        )
        assert row is not None
        if row["members"] != singles or row["keys"] != singles:
            raise SystemExit(f"single creates: not each exactly once: {dict(row)}")
    finally:
        await conn.close()
    return rate, counts


async def measure(
    admin_dsn: str, batches: int, batch_size: int, singles: int = 10_000, clients: int = 200
) -> BatchResults:
    async with common.fresh_database(admin_dsn) as dsn:
        engine, engine_overall = await _path(dsn, "engine", _engine, batches, batch_size)
    async with common.fresh_database(admin_dsn) as dsn:
        http, http_overall = await _path(dsn, "HTTP", _http, batches, batch_size)
    async with common.fresh_database(admin_dsn) as dsn:
        singles_rate, counts = await _singles(dsn, singles, clients)
    return BatchResults(
        batches=batches,
        batch_size=batch_size,
        engine_per_batch=Spread.of(engine),
        engine_overall=engine_overall,
        http_per_batch=Spread.of(http),
        http_overall=http_overall,
        singles=singles,
        clients=clients,
        singles_per_s=singles_rate,
        singles_over_batch=singles_rate / http_overall,
        singles_503=counts["503"],
        singles_429=counts["429"],
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dsn_argument(parser)
    parser.add_argument("--batches", type=int, default=10, help="batches per path (10)")
    parser.add_argument("--batch-size", type=int, default=1000, help="members per batch (1000)")
    parser.add_argument(
        "--singles", type=int, default=10_000, help="single creates, all clients (10000)"
    )
    parser.add_argument(
        "--clients", type=int, default=200, help="concurrent clients of the single creates (200)"
    )


async def _run(args: argparse.Namespace) -> BatchResults:
    await common.durable_server(args.dsn)
    return await measure(args.dsn, args.batches, args.batch_size, args.singles, args.clients)


def run(args: argparse.Namespace) -> int:
    if args.batches < 1 or not 1 <= args.batch_size <= 1000:
        raise SystemExit("--batches must be >= 1 and --batch-size 1..1000")
    if args.singles < 1 or args.clients < 1:
        raise SystemExit("--singles and --clients must be >= 1")
    r = asyncio.run(_run(args))
    return report(
        r,
        [
            "path",
            f"per batch of {r.batch_size:,}, requests/s",
            f"{r.batches * r.batch_size:,} queued overall",
        ],
        [
            [
                "engine (respool.create_requests)",
                r.engine_per_batch.fmt(),
                f"{r.engine_overall:,.0f}/s",
            ],
            ["HTTP (POST /v1/requests/batch)", r.http_per_batch.fmt(), f"{r.http_overall:,.0f}/s"],
            [
                f"HTTP single creates ({r.clients} clients, {r.singles:,} in all; "
                f"{r.singles_503} × 503, {r.singles_429} × 429 retried)",
                "",
                f"{r.singles_per_s:,.0f}/s = {r.singles_over_batch:.2f} × batch",
            ],
        ],
    )
