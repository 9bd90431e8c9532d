"""Scenario 7: a peer on the same server in the same run. pgqueuer is a well-known PostgreSQL job
queue on asyncpg (``FOR UPDATE SKIP LOCKED`` dequeue, LISTEN/NOTIFY wake-ups).

Its benchmark tool (``tools/benchmark.py``, strategy ``throughput``) is not part of the
``pgqueuer`` package, so this module runs the same method through pgqueuer's public API, with
that tool's defaults: 1 producer task enqueuing batches of 10 jobs, 5 consumer ``PgQueuer``
instances (one asyncpg connection each) dequeuing batches of 10, two entrypoints that only count
(both async: pgqueuer 1.6 no longer runs sync ones), for a fixed time; jobs/s = jobs run /
elapsed. The schema is installed with ``Queries.install()`` into the run's own database.
Needs ``pip install 'respool[bench]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench.common import Spread, log

PRODUCERS = 1
PRODUCER_BATCH = 10
CONSUMERS = 5
CONSUMER_BATCH = 10


@dataclass
class PeerResults:
    version: str
    jobs: Spread | None = None
    error: str | None = None
    settings: dict[str, int] = field(
        default_factory=lambda: {
            "producers": PRODUCERS,
            "producer_batch": PRODUCER_BATCH,
            "consumers": CONSUMERS,
            "consumer_batch": CONSUMER_BATCH,
        }
    )

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "jobs_per_s": self.jobs.as_dict() if self.jobs else None,
            "error": self.error,
            "settings": self.settings,
        }


def pgqueuer_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("pgqueuer")
    except metadata.PackageNotFoundError:
        return None


async def _one_run(dsn: str, seconds: float) -> float:
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    admin = await asyncpg.connect(dsn, timeout=30)
    conns: list[asyncpg.Connection] = [admin]
    try:
        queries = Queries(AsyncpgDriver(admin))
        await queries.clear_statistics_log()
        await queries.clear_queue()
        done = 0
        lock = threading.Lock()

        def count() -> None:
            nonlocal done
            with lock:
                done += 1

        consumers: list[PgQueuer] = []
        for _ in range(CONSUMERS):
            conn = await asyncpg.connect(dsn, timeout=30)
            conns.append(conn)
            pgq = PgQueuer(AsyncpgDriver(conn))

            @pgq.entrypoint("asyncfetch")
            async def asyncfetch(job: Job) -> None:
                count()

            @pgq.entrypoint("syncfetch")  # pgqueuer 1.6 runs async entrypoints only
            async def syncfetch(job: Job) -> None:
                count()

            consumers.append(pgq)

        stop = asyncio.Event()
        serial = 0

        async def produce() -> None:
            nonlocal serial
            conn = await asyncpg.connect(dsn, timeout=30)
            conns.append(conn)
            q = Queries(AsyncpgDriver(conn))
            entrypoints = ["syncfetch", "asyncfetch"] * PRODUCER_BATCH
            while not stop.is_set():
                payloads: list[bytes | None] = []
                for _ in range(PRODUCER_BATCH):
                    serial += 1
                    payloads.append(str(serial).encode())
                await q.enqueue(
                    random.sample(entrypoints, k=PRODUCER_BATCH),
                    payloads,
                    [0] * PRODUCER_BATCH,
                )

        tasks = [asyncio.create_task(p.run(batch_size=CONSUMER_BATCH)) for p in consumers]
        tasks += [asyncio.create_task(produce()) for _ in range(PRODUCERS)]
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        with lock:
            ran = done
        elapsed = time.perf_counter() - started
        stop.set()
        for p in consumers:
            p.shutdown.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        return ran / elapsed
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                await c.close()


async def measure(dsn: str, seconds: float, repeats: int) -> PeerResults:
    version = pgqueuer_version()
    if version is None:
        return PeerResults("not installed", error="pip install 'respool[bench]' (pgqueuer)")
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()
    rates = []
    for rep in range(repeats):
        rate = await _one_run(dsn, seconds)
        rates.append(rate)
        log(f"  peer: repeat {rep + 1}/{repeats} pgqueuer {rate:,.0f} jobs/s")
    return PeerResults(version, Spread.of(rates))
