"""Scenario 3: HTTP cycles. The engine cycle of scenario 2 through the API: ``POST /v1/requests``
(granted at once) then ``POST /v1/requests/{id}/release``, by N keep-alive connections of an
asyncio load generator (bench.rawhttp) against one ``respool serve`` process (default settings:
a pool of 10 database connections, the reconciler on). Latency is one whole cycle (two HTTP
requests), measured by the generator.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import msgspec

from bench.common import PerClients, Spread, bench_connect, log
from bench.cycles import check_engine_run, setup_engine
from bench.rawhttp import Connection, split_url
from bench.wake import percentile, serve


@dataclass
class HttpResults(PerClients):
    cycles: dict[int, Spread] = field(default_factory=dict)
    p50_ms: dict[int, Spread] = field(default_factory=dict)
    p99_ms: dict[int, Spread] = field(default_factory=dict)


_decode = msgspec.json.Decoder().decode


async def _client(
    url: str, subjects: int, pools: int, stop_at: float, latencies: list[float]
) -> None:
    host, port = split_url(url)
    conn = await Connection(host, port).open()
    try:
        while time.perf_counter() < stop_at:
            body = msgspec.json.encode(
                {
                    "subject": f"bench-s{random.randint(1, subjects)}",  # noqa: S311
                    "pool": f"bench-p{random.randint(1, pools)}",  # noqa: S311
                    "resources": {"gpu": 1},
                }
            )
            started = time.perf_counter()
            created = await conn.request("POST", "/v1/requests", body)
            doc = _decode(created.body)
            if created.status != 201 or doc["status"] != "allocated":
                raise SystemExit(f"create answered {created.status}: {created.body[:300]!r}")
            released = await conn.request("POST", f"/v1/requests/{doc['id']}/release")
            if released.status != 200 or _decode(released.body)["status"] != "released":
                raise SystemExit(f"release answered {released.status}: {released.body[:300]!r}")
            latencies.append(time.perf_counter() - started)
    finally:
        await conn.close()


async def one_run(
    url: str, clients: int, seconds: float, subjects: int, pools: int
) -> tuple[float, list[float]]:
    """(cycles per second, cycle latencies in seconds) of one run."""
    latencies: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(_client(url, subjects, pools, started + seconds, latencies) for _ in range(clients))
    )
    elapsed = time.perf_counter() - started
    return len(latencies) / elapsed, latencies


async def measure(
    dsn: str, clients: list[int], seconds: float, repeats: int, subjects: int, pools: int
) -> HttpResults:
    conn = await bench_connect(dsn)
    try:
        await setup_engine(conn, subjects, pools)
        samples: dict[int, list[tuple[float, list[float]]]] = {c: [] for c in clients}
        with serve(dsn, reconciler=True) as url:
            await one_run(url, 1, min(1.0, seconds), subjects, pools)  # warm the server up
            await check_engine_run(conn)
            for rep in range(repeats):
                for c in clients:
                    rate, lat = await one_run(url, c, seconds, subjects, pools)
                    samples[c].append((rate, lat))
                    await check_engine_run(conn)
                    log(
                        f"  http: repeat {rep + 1}/{repeats} {c:>2} clients {rate:,.0f} cycles/s "
                        f"p50 {percentile(lat, 50) * 1000:.1f} ms "
                        f"p99 {percentile(lat, 99) * 1000:.1f} ms"
                    )
    finally:
        await conn.close()
    results = HttpResults(clients)
    for c, runs in samples.items():
        results.cycles[c] = Spread.of([r for r, _ in runs])
        results.p50_ms[c] = Spread.of([percentile(lat, 50) * 1000 for _, lat in runs])
        results.p99_ms[c] = Spread.of([percentile(lat, 99) * 1000 for _, lat in runs])
    return results
