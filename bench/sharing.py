"""Scenario ``sharing``: what shared devices (docs/placement.md, "Sharing a GPU") cost a grant.

Through the engine only (one asyncpg connection, one fresh database): two pools of ``--nodes``
nodes × 8 GPUs, one whose GPUs are whole only (``plain``) and one whose GPUs are shared
(``mps``, 80 GB each). Each sample is a create that is granted at once plus the release of the
oldest holder, with ``--held`` grants held throughout, for three shapes: one whole GPU in the
plain pool, one whole GPU in the shared pool, and a slice (20 GB, share 25) in the shared pool.
After one warm-up round of each shape and an ANALYZE (on a new connection, so that plans see
tables of a realistic size), rounds alternate the shapes so that load drift touches all three;
the figures are cycles per second (median of ``--rounds``) and each shape's ratio to the plain
pool's. Commits do not wait for the disk (``synchronous_commit = off``), so the figure is the
engine's work. Every grant must be immediate, and no invariant may break (I1-I9).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import common
from bench.common import DEFAULT_DSN, Figures, broken_invariants, log, report

SUMMARY = "shared GPUs: grant+release cycles of slices and whole GPUs against whole-only nodes"
SHAPES: dict[str, tuple[str, dict[str, int]]] = {
    "plain gpu:1": ("plain", {"gpu": 1}),
    "shared gpu:1": ("shared", {"gpu": 1}),
    "shared slice": ("shared", {"gpu_memory_mb": 20480, "gpu_share": 25}),
}


@dataclass
class SharingResults(Figures):
    nodes: int
    held: int
    cycles: int
    rounds: int
    cycles_per_s: dict[str, list[float]]
    median_cycles_per_s: dict[str, float]
    ratio_to_plain: dict[str, float]


async def _setup(conn: asyncpg.Connection, nodes: int) -> None:
    for pool, shared in (("plain", False), ("shared", True)):
        await conn.execute("SELECT respool.create_pool(p_name => $1)", pool)
        await conn.execute("SELECT respool.create_policy(p_subject => 's', p_pool => $1)", pool)
        for i in range(nodes):
            body: dict[str, Any] = {
                "name": f"{pool}-{i}",
                "pool": pool,
                "devices": {"gpu": [str(d) for d in range(8)]},
            }
            if shared:
                body |= {"sharing": {"gpu": "mps"}, "device_memory_mb": {"gpu": 81920}}
            await conn.execute("SELECT respool.create_node($1)", body)


async def _create(conn: asyncpg.Connection, pool: str, resources: dict[str, int]) -> Any:
    doc = await conn.fetchval(
        "SELECT request FROM respool.create_request($1)",
        {"subject": "s", "pool": pool, "resources": resources},
    )
    if doc["status"] != "allocated":
        raise SystemExit(f"sharing: a create in {pool} answered {doc['status']}: {doc['message']}")
    return doc["id"]


async def _round(
    conn: asyncpg.Connection, pool: str, resources: dict[str, int], held: int, cycles: int
) -> float:
    holders = [await _create(conn, pool, resources) for _ in range(held)]
    started = time.perf_counter()
    for _ in range(cycles):
        holders.append(await _create(conn, pool, resources))
        await conn.execute("SELECT respool.release_request(p_id => $1)", holders.pop(0))
    elapsed = time.perf_counter() - started
    for rid in holders:
        await conn.execute("SELECT respool.release_request(p_id => $1)", rid)
    return cycles / elapsed


async def _run(args: argparse.Namespace) -> SharingResults:
    await common.durable_server(args.dsn)
    rates: dict[str, list[float]] = {name: [] for name in SHAPES}
    async with common.fresh_database(args.dsn) as dsn:
        conn = await common.bench_connect(dsn)
        try:
            await conn.execute("SET synchronous_commit = off")
            await _setup(conn, args.nodes)
            # Warm up, then plan against tables of a realistic size (as autovacuum's ANALYZE
            # makes a long-running service do): plans cached against the empty tables are scans.
            for pool, resources in SHAPES.values():
                await _round(conn, pool, resources, args.held, args.cycles)
            await conn.execute("ANALYZE")
            await conn.close()
            conn = await common.bench_connect(dsn)
            await conn.execute("SET synchronous_commit = off")
            for r in range(args.rounds):
                for name, (pool, resources) in SHAPES.items():
                    rate = await _round(conn, pool, resources, args.held, args.cycles)
                    rates[name].append(round(rate, 1))
                    log(f"round {r + 1}: {name} {rate:,.0f} cycles/s")
            if await broken_invariants(conn):
                raise SystemExit("sharing: invariant violations")
        finally:
            await conn.close()
    medians = {name: round(statistics.median(r), 1) for name, r in rates.items()}
    plain = medians["plain gpu:1"]
    return SharingResults(
        nodes=args.nodes,
        held=args.held,
        cycles=args.cycles,
        rounds=args.rounds,
        cycles_per_s=rates,
        median_cycles_per_s=medians,
        ratio_to_plain={name: round(m / plain, 2) for name, m in medians.items()},
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a durable PostgreSQL server")
    parser.add_argument("--nodes", type=int, default=8, help="nodes per pool, 8 GPUs each (8)")
    parser.add_argument("--held", type=int, default=32, help="grants held while cycling (32)")
    parser.add_argument("--cycles", type=int, default=500, help="cycles per round (500)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per shape (3)")


def run(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.held < 1 or args.cycles < 1 or args.rounds < 1:
        raise SystemExit("--nodes, --held, --cycles and --rounds must be at least 1")
    if args.held + 1 > args.nodes * 8:
        raise SystemExit("--held must leave a GPU free for the cycles")
    result = asyncio.run(_run(args))
    rows = [
        (name, result.median_cycles_per_s[name], result.ratio_to_plain[name]) for name in SHAPES
    ]
    return report(result, ("shape", "cycles/s (median)", "÷ plain gpu:1"), rows)
