"""Scenario ``baseline``: the engine's cycle against a minimal allocator with the same essentials.

The minimal allocator (``bench/baseline.sql``, schema ``bench_min``) does what any allocator of
this kind must: a request row; guarded counters per key on the pool and the policy; an event
row per status change; the pool row as the lock; a NOTIFY on release. Both cycles are
create → allocated → release, two transactions, driven by pgbench alike (``-M prepared``) on
the same server, the same pools × subjects, and the same final resource map
(``{"gpu": 1, "step_run": 1}``); runs alternate (minimal, engine) so that load drift touches
both. The ratio engine ÷ minimal is the share of the essentials' speed the engine keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench import common
from bench.common import PerClients, Spread, add_dsn_argument, log, ratio, report
from bench.cycles import ENGINE_SQL, check_engine_run, setup_engine

SUMMARY = "engine cycle vs a minimal same-essentials allocator cycle (bench/baseline.sql)"
SQL = Path(__file__).with_name("baseline.sql")

MINIMAL_SQL = """\\set s random(1, :subjects)
\\set p random(1, :pools)
SELECT bench_min.create_request('bench-s' || :s::text, 'bench-p' || :p::text,
    '{"gpu": 1, "step_run": 1}'::jsonb) AS rid \\gset
SELECT bench_min.release_request(:rid::uuid);
"""


@dataclass
class BaselineResults(PerClients):
    minimal: dict[int, Spread] = field(default_factory=dict)
    engine: dict[int, Spread] = field(default_factory=dict)

    def ratio(self, clients: int) -> float:
        return ratio(self.engine[clients], self.minimal[clients])

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["engine_over_minimal"] = {str(c): self.ratio(c) for c in self.clients}
        return out


async def setup_minimal(conn: asyncpg.Connection, subjects: int, pools: int) -> None:
    await conn.execute(SQL.read_text())
    await conn.execute(
        "INSERT INTO bench_min.pools (name) SELECT 'bench-p' || g FROM generate_series(1, $1) g",
        pools,
    )
    await conn.execute(
        "INSERT INTO bench_min.pool_counters (pool_id, key, capacity)"
        " SELECT id, k, 1000000 FROM bench_min.pools, unnest(ARRAY['gpu', 'step_run']) k"
    )
    await conn.execute(
        "INSERT INTO bench_min.policies (subject, pool_id)"
        " SELECT 'bench-s' || g, p.id FROM generate_series(1, $1) g, bench_min.pools p",
        subjects,
    )
    await conn.execute(
        "INSERT INTO bench_min.policy_counters (policy_id, key)"
        " SELECT id, k FROM bench_min.policies, unnest(ARRAY['gpu', 'step_run']) k"
    )
    await conn.execute("VACUUM ANALYZE")


async def check_minimal_run(conn: asyncpg.Connection) -> int:
    """Every minimal request released and every counter back at 0; then ANALYZE (the history
    stays, as the engine's does: check_engine_run)."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, count(*) FILTER (WHERE status <> 'released') AS open"
        "  FROM bench_min.requests"
    )
    assert row is not None
    used = await conn.fetchval(
        "SELECT (SELECT coalesce(sum(used), 0) FROM bench_min.pool_counters)"
        "     + (SELECT coalesce(sum(used), 0) FROM bench_min.policy_counters)"
    )
    if row["open"] or used:
        raise SystemExit(f"minimal cycles went wrong: {dict(row)}, {used} units still used")
    await conn.execute(
        "VACUUM ANALYZE bench_min.events, bench_min.requests,"
        " bench_min.pool_counters, bench_min.policy_counters"
    )
    return int(row["n"])


async def measure(
    dsn: str, clients: list[int], seconds: float, repeats: int, subjects: int, pools: int
) -> BaselineResults:
    pgbench = common.find_pgbench()
    samples: dict[str, dict[int, list[float]]] = {
        "minimal": {c: [] for c in clients},
        "engine": {c: [] for c in clients},
    }
    conn = await common.bench_connect(dsn)
    try:
        await setup_engine(conn, subjects, pools)
        await setup_minimal(conn, subjects, pools)
        with tempfile.TemporaryDirectory(prefix="respool-bench-") as tmp:
            scripts = {"minimal": Path(tmp, "minimal.sql"), "engine": Path(tmp, "engine.sql")}
            scripts["minimal"].write_text(MINIMAL_SQL)
            scripts["engine"].write_text(ENGINE_SQL)
            defines = {"subjects": str(subjects), "pools": str(pools)}
            for name in ("minimal", "engine"):  # history first (check_engine_run), unmeasured
                await common.run_pgbench(
                    pgbench, dsn, scripts[name], clients=max(clients),
                    seconds=min(common.WARM_UP_SECONDS, seconds), defines=defines,
                )  # fmt: skip
            await check_minimal_run(conn)
            await check_engine_run(conn)
            for rep in range(repeats):
                for c in clients:
                    for name in ("minimal", "engine"):
                        tps = await common.run_pgbench(
                            pgbench, dsn, scripts[name], clients=c, seconds=seconds,
                            defines=defines,
                        )  # fmt: skip
                        samples[name][c].append(tps)
                        if name == "engine":
                            await check_engine_run(conn)
                        else:
                            await check_minimal_run(conn)
                        log(f"  baseline: {rep + 1}/{repeats} {name:7} {c:>2} clients {tps:,.0f}/s")
    finally:
        await conn.close()
    results = BaselineResults(clients)
    for name in ("minimal", "engine"):
        setattr(results, name, {c: Spread.of(v) for c, v in samples[name].items()})
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dsn_argument(parser)
    parser.add_argument("--clients", default="1,8", help="client counts (default 1,8)")
    parser.add_argument("--seconds", type=float, default=10, help="seconds per run (10)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (3)")
    parser.add_argument("--subjects", type=int, default=32, help="subjects (32)")
    parser.add_argument("--pools", type=int, default=8, help="pools (8)")


async def _run(args: argparse.Namespace, clients: list[int]) -> BaselineResults:
    await common.durable_server(args.dsn)
    async with common.fresh_database(args.dsn) as dsn:
        return await measure(dsn, clients, args.seconds, args.repeats, args.subjects, args.pools)


def run(args: argparse.Namespace) -> int:
    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    r = asyncio.run(_run(args, clients))
    return report(
        r,
        ["clients", "minimal cycles/s", "engine cycles/s", "engine ÷ minimal"],
        [[c, r.minimal[c].fmt(), r.engine[c].fmt(), f"{r.ratio(c):.2f}"] for c in clients],
    )
