"""Scenarios 1 and 2: the physical limit and engine cycles, both driven by pgbench.

1. **Physical limit.** The smallest write transaction on the same server: a one-row ``UPDATE`` by
   random key (``bench_rows``, 100,000 rows), and the same with a ``pg_notify`` in the
   transaction (a LISTEN connection is open meanwhile, as the API's listener always is).
2. **Engine cycles.** create → allocated → release through the SQL functions, no HTTP:
   ``respool.create_request`` (a random subject of ``--subjects`` on a random pool of
   ``--pools``, every subject has a policy on every pool, capacity never runs out, so the
   request is granted in its own transaction) then ``respool.release_request``. One cycle is two
   transactions. After each run every request must be released and must have been granted in the
   transaction that created it.

pgbench drives both (``-M prepared``, ``-j`` = min(clients, cores)), so the client's overhead is
the same C program's.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from bench import common
from bench.common import PerClients, Spread, log

SUMMARY = "physical limit (pgbench one-row UPDATE, with and without NOTIFY) and engine cycles"
ROWS = 100_000
NOTIFY_CHANNEL = "respool_bench_pgbench"

# pgbench scripts (constants only)
UPDATE_SQL = (
    "\\set k random(1, " + str(ROWS) + ")\nUPDATE bench_rows SET n = n + 1 WHERE id = :k;\n"
)
NOTIFY_SQL = (
    "\\set k random(1, " + str(ROWS) + ")\n"  # noqa: S608 - a pgbench script of constants
    "BEGIN;\n"
    "UPDATE bench_rows SET n = n + 1 WHERE id = :k;\n"
    "SELECT pg_notify('" + NOTIFY_CHANNEL + "', :k::text);\n"
    "END;\n"
)
ENGINE_SQL = """\\set s random(1, :subjects)
\\set p random(1, :pools)
SELECT c.request->>'id' AS rid FROM respool.create_request(jsonb_build_object(
    'subject', 'bench-s' || :s::text, 'pool', 'bench-p' || :p::text,
    'resources', '{"gpu": 1}'::jsonb, 'lease_seconds', 300)) c \\gset
SELECT respool.release_request(p_id => :rid::uuid) IS NOT NULL;
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", default="1,8,32", help="client counts (default 1,8,32)")
    parser.add_argument("--seconds", type=float, default=10, help="seconds per run (default 10)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument("--subjects", type=int, default=32, help="subjects (default 32)")
    parser.add_argument("--pools", type=int, default=8, help="pools (default 8)")


@dataclass
class CycleResults(PerClients):
    update: dict[int, Spread] = field(default_factory=dict)
    notify: dict[int, Spread] = field(default_factory=dict)
    engine: dict[int, Spread] = field(default_factory=dict)


async def setup_engine(conn: asyncpg.Connection, subjects: int, pools: int) -> None:
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS bench_rows (id integer PRIMARY KEY, n bigint NOT NULL)"
    )
    await conn.execute(
        "INSERT INTO bench_rows SELECT g, 0 FROM generate_series(1, $1::integer) g"
        " ON CONFLICT DO NOTHING",
        ROWS,
    )
    for p in range(1, pools + 1):
        await conn.execute(
            "SELECT respool.create_pool(p_name => $1, p_capacity => $2)",
            f"bench-p{p}",
            {"gpu": 1_000_000},
        )
        for s in range(1, subjects + 1):
            await conn.execute(
                "SELECT respool.create_policy(p_subject => $1, p_pool => $2)",
                f"bench-s{s}",
                f"bench-p{p}",
            )
    await conn.execute("VACUUM ANALYZE")


async def check_engine_run(conn: asyncpg.Connection) -> int:
    """Every request released, each granted in the transaction that created it; then ANALYZE.
    The history stays: each run's new connections plan the engine's statements against tables
    of a realistic size. (Emptied tables made every PL/pgSQL plan cached in a run a sequential
    scan, which then grew with the run: 1 ms per key lookup at 3,000 requests.) Returns the
    requests seen."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n,"
        "       count(*) FILTER (WHERE status <> 'released') AS not_released,"
        "       count(*) FILTER (WHERE allocated_at IS DISTINCT FROM created_at) AS waited"
        "  FROM respool.requests"
    )
    assert row is not None
    if row["not_released"] or row["waited"]:
        raise SystemExit(f"engine cycles went wrong: {dict(row)}")
    bad = await common.broken_invariants(conn)
    if bad:
        raise SystemExit(f"engine cycles left {bad} invariant violations")
    await conn.execute("VACUUM ANALYZE respool.requests, respool.events, respool.queue_entries")
    await conn.execute(
        "VACUUM ANALYZE respool.pool_resources, respool.policy_resources, respool.pools"
    )
    return int(row["n"])


async def measure(
    dsn: str,
    clients: list[int],
    seconds: float,
    repeats: int,
    subjects: int,
    pools: int,
) -> CycleResults:
    """Runs every (repeat, clients) round as update, notify, engine in turn, so that drift in
    the machine's load touches all three alike."""
    pgbench = common.find_pgbench()
    results = CycleResults(clients)
    samples: dict[str, dict[int, list[float]]] = {
        "update": {c: [] for c in clients},
        "notify": {c: [] for c in clients},
        "engine": {c: [] for c in clients},
    }
    conn = await common.bench_connect(dsn)
    listener = await asyncpg.connect(dsn, timeout=30)
    heard = 0

    def on_note(*_: object) -> None:
        nonlocal heard
        heard += 1

    await listener.add_listener(NOTIFY_CHANNEL, on_note)
    try:
        await setup_engine(conn, subjects, pools)
        with tempfile.TemporaryDirectory(prefix="respool-bench-") as tmp:
            scripts = {
                "update": Path(tmp, "update.sql"),
                "notify": Path(tmp, "notify.sql"),
                "engine": Path(tmp, "engine.sql"),
            }
            scripts["update"].write_text(UPDATE_SQL)
            scripts["notify"].write_text(NOTIFY_SQL)
            scripts["engine"].write_text(ENGINE_SQL)
            defines = {"subjects": str(subjects), "pools": str(pools)}
            await common.run_pgbench(  # history first (check_engine_run), unmeasured
                pgbench, dsn, scripts["engine"], clients=max(clients),
                seconds=min(common.WARM_UP_SECONDS, seconds), defines=defines,
            )  # fmt: skip
            await check_engine_run(conn)
            for rep in range(repeats):
                for c in clients:
                    for name in ("update", "notify", "engine"):
                        tps = await common.run_pgbench(
                            pgbench,
                            dsn,
                            scripts[name],
                            clients=c,
                            seconds=seconds,
                            defines=defines if name == "engine" else None,
                        )
                        samples[name][c].append(tps)
                        if name == "engine":
                            await check_engine_run(conn)
                        else:
                            await conn.execute("VACUUM bench_rows")
                        log(f"  cycles: {rep + 1}/{repeats} {name:6} {c:>2} clients {tps:,.0f}/s")
        await asyncio.sleep(0.2)
        if heard == 0:
            raise SystemExit("the LISTEN connection heard none of the NOTIFY runs")
    finally:
        await listener.close()
        await conn.close()
    for name in ("update", "notify", "engine"):
        setattr(results, name, {c: Spread.of(v) for c, v in samples[name].items()})
    return results
