"""Reproduce a burst of creates against a real ``respool serve``: N concurrent
``POST /v1/requests`` over C keep-alive connections (httpx), database pool P.

    RESPOOL_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/burst \
        python tests/api/burst_repro.py --creates 3000 --connections 300 --pool 5

The database must exist and be migrated (``respool db migrate``). Prints the count of each
status code and of each transport error (``ReadError`` etc.), counted separately.
Run it as a script; tests/api/test_burst.py holds the regression test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.server import ServeProcess  # noqa: E402


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--creates", type=int, default=3000)
    p.add_argument("--connections", type=int, default=300)
    p.add_argument("--pool", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args()
    dsn = os.environ["RESPOOL_DATABASE_URL"]
    conn = await asyncpg.connect(dsn)
    try:
        if not await conn.fetchval("SELECT count(*) FROM respool.pools WHERE name = 'wide'"):
            await conn.execute(
                "SELECT respool.create_pool(p_name => 'wide', p_capacity => $1::jsonb)",
                json.dumps({"gpu": 1_000_000}),
            )
            await conn.execute("SELECT respool.create_policy(p_subject => 'w', p_pool => 'wide')")
    finally:
        await conn.close()
    serve = ServeProcess(
        dsn, LOGDIR, reconciler=True, RESPOOL_DB_POOL_SIZE=str(a.pool), RESPOOL_LOG_LEVEL="WARNING"
    )
    serve.start()
    try:
        await serve.ready()
        for rnd in range(a.rounds):
            t0 = time.perf_counter()
            counts = await burst(serve.url, a.creates, a.connections)
            print(f"round {rnd}: {dict(counts)} in {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        serve.close()
        print(serve.log(3000))


async def burst(url: str, creates: int, connections: int) -> collections.Counter[str]:
    """``creates`` concurrent creates over ``connections`` keep-alive connections."""
    counts: collections.Counter[str] = collections.Counter()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    body = {"subject": "w", "pool": "wide", "resources": {"gpu": 1}}
    # httpx's pool spends its time on thousands of queued requests (the connects time out); at
    # most one request per connection in flight is the same burst.
    gate = asyncio.Semaphore(connections)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one() -> None:
            try:
                async with gate:
                    r = await client.post("/v1/requests", json=body)
                counts[str(r.status_code)] += 1
            except httpx.HTTPError as exc:
                counts[f"{type(exc).__name__}: {exc!r}"[:120]] += 1

        await asyncio.gather(*(one() for _ in range(creates)))
    return counts


LOGDIR = Path("/tmp/burst-repro")

if __name__ == "__main__":
    LOGDIR.mkdir(exist_ok=True)
    asyncio.run(main())
