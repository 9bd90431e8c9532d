"""Scenario ``batch``: requests queued per second by batch create
(docs/scheduling.md, "Batch create").

A pool of one GPU held by one request, so every member queues (the costly case: each member
gets a queue entry and an exact queue position). ``--batches`` batches of ``--batch-size``
members are created one after another, first through ``respool.create_requests`` (the engine,
one asyncpg connection), then in a fresh database through ``POST /v1/requests/batch`` on one
``respool serve`` process. Rate = members queued ÷ wall time, per batch and overall. After
each path every member must be queued, in member order, with no invariant broken.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx

from app.db import batch as db_batch
from bench.common import (
    Figures,
    Spread,
    add_dsn_argument,
    bench_connect,
    durable_server,
    fresh_database,
    gpu_members,
    log,
    report,
)
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


async def _setup(conn: asyncpg.Connection) -> None:
    await conn.execute("SELECT respool.create_pool(p_name => 'b', p_capacity => $1)", {"gpu": 1})
    await conn.execute("SELECT respool.create_policy(p_subject => 'b', p_pool => 'b')")
    await conn.execute(
        "SELECT created FROM respool.create_request(jsonb_build_object('subject', 'b',"
        " 'pool', 'b', 'resources', $1::jsonb))",
        {"gpu": 1},
    )


async def _check(conn: asyncpg.Connection, expected: int) -> None:
    queued = await conn.fetchval("SELECT count(*) FROM respool.requests WHERE status = 'queued'")
    if queued != expected:
        raise SystemExit(f"batch: {queued} queued, expected {expected}")
    disorder = await conn.fetchval(
        "SELECT count(*) FROM (SELECT position, labels, lag(created_at) OVER (ORDER BY position)"
        "   AS before, created_at FROM respool.queue q JOIN respool.requests r"
        "   ON r.id = q.request_id) x WHERE before > created_at"
    )
    if disorder:
        raise SystemExit(f"batch: {disorder} members out of queue order")
    if await conn.fetchval("SELECT count(*) FROM respool.invariant_violations"):
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
    conn = await bench_connect(dsn)
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


async def measure(admin_dsn: str, batches: int, batch_size: int) -> BatchResults:
    async with fresh_database(admin_dsn) as dsn:
        engine, engine_overall = await _path(dsn, "engine", _engine, batches, batch_size)
    async with fresh_database(admin_dsn) as dsn:
        http, http_overall = await _path(dsn, "HTTP", _http, batches, batch_size)
    return BatchResults(
        batches=batches,
        batch_size=batch_size,
        engine_per_batch=Spread.of(engine),
        engine_overall=engine_overall,
        http_per_batch=Spread.of(http),
        http_overall=http_overall,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dsn_argument(parser)
    parser.add_argument("--batches", type=int, default=10, help="batches per path (10)")
    parser.add_argument("--batch-size", type=int, default=1000, help="members per batch (1000)")


async def _run(args: argparse.Namespace) -> BatchResults:
    await durable_server(args.dsn)
    return await measure(args.dsn, args.batches, args.batch_size)


def run(args: argparse.Namespace) -> int:
    if args.batches < 1 or not 1 <= args.batch_size <= 1000:
        raise SystemExit("--batches must be >= 1 and --batch-size 1..1000")
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
        ],
    )
