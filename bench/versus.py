"""Scenario ``versus``: the engine's cycle with this tree's SQL functions against another commit's.

Through the engine only, one asyncpg connection per side: two fresh databases migrated by this
tree; into the second, the SQL function files of ``--rev`` that differ from this tree's are
applied on top (``git show REV:sql/functions/…``; they replace functions, so the rest of the
schema stays this tree's, and ``--rev`` must have the same migrations). Both get the pools and
policies of ``python -m bench cycles`` and ``--warmup`` cycles, then ANALYZE. Then rounds go
side by side, the order alternating: each round times ``--cycles`` creates (granted at once) and
their releases on each side. The figures are the medians of the rounds' means, per create and per
release, and this tree ÷ ``--rev``. Commits do not wait for the disk (``synchronous_commit =
off``), so the figure is the engine's work. Run it from a git checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bench import common
from bench.common import DEFAULT_DSN, Figures, broken_invariants, log, report
from bench.cycles import setup_engine

SUMMARY = "engine cycle: this tree's SQL functions against another commit's, side by side"
REPO = Path(__file__).resolve().parent.parent
SUBJECTS, POOLS = 32, 8
CREATE = """SELECT (c.request->>'id')::uuid FROM respool.create_request(jsonb_build_object(
    'subject', 'bench-s' || $1::text, 'pool', 'bench-p' || $2::text,
    'resources', '{"gpu": 1}'::jsonb, 'lease_seconds', 300)) c"""
RELEASE = "SELECT respool.release_request(p_id => $1::uuid) IS NOT NULL"


@dataclass
class VersusResults(Figures):
    rev: str
    replaced_files: list[str]
    rounds: int
    cycles_per_round: int
    create_ms: dict[str, float]
    release_ms: dict[str, float]
    tree_over_rev: dict[str, float]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", default=DEFAULT_DSN, help=f"server (default: {DEFAULT_DSN})")
    parser.add_argument("--rev", default="HEAD", help="the commit to compare with (HEAD)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per side (10)")
    parser.add_argument("--cycles", type=int, default=200, help="cycles per round (200)")
    parser.add_argument("--warmup", type=int, default=3000, help="cycles before timing (3000)")


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise SystemExit("versus: git not found: run it from a git checkout") from None
    if done.returncode != 0:
        raise SystemExit(f"versus: git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout


def rev_functions(rev: str) -> dict[str, str]:
    """The SQL function files of ``rev`` that differ from this tree's (and exist in ``rev``),
    by path. Refused when the migrations differ: the schemas would not match."""
    if _git("diff", "--name-only", rev, "--", "sql/migrations").strip():
        raise SystemExit(f"versus: {rev} has other migrations than this tree")
    changed = _git("diff", "--name-only", "--diff-filter=MD", rev, "--", "sql/functions").split()
    return {path: _git("show", f"{rev}:{path}") for path in changed}


class _Side:
    """One database and connection: the engine's cycle, timed a round at a time."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.create_ms: list[float] = []
        self.release_ms: list[float] = []

    async def setup(self, functions: dict[str, str], warmup: int) -> None:
        await self.conn.execute("SET synchronous_commit = off")
        for text in functions.values():
            await self.conn.execute(text)
        await setup_engine(self.conn, SUBJECTS, POOLS)
        self.create = await self.conn.prepare(CREATE)
        self.release = await self.conn.prepare(RELEASE)
        await self.cycles(warmup)
        await self.conn.execute("ANALYZE")

    async def cycles(self, n: int) -> tuple[float, float]:
        """``n`` creates and releases; seconds spent in each."""
        in_create = in_release = 0.0
        for _ in range(n):
            started = time.perf_counter()
            rid = await self.create.fetchval(
                str(random.randint(1, SUBJECTS)), str(random.randint(1, POOLS))
            )
            created = time.perf_counter()
            if not await self.release.fetchval(rid):
                raise SystemExit("versus: a release did not end its request")
            in_create += created - started
            in_release += time.perf_counter() - created
        return in_create, in_release

    async def round(self, n: int) -> None:
        in_create, in_release = await self.cycles(n)
        self.create_ms.append(in_create / n * 1000)
        self.release_ms.append(in_release / n * 1000)


async def _run(args: argparse.Namespace) -> VersusResults:
    await common.durable_server(args.dsn)
    functions = rev_functions(args.rev)
    log(f"{args.rev}: {len(functions)} function files differ: {', '.join(functions) or 'none'}")
    async with contextlib.AsyncExitStack() as stack:
        sides: dict[str, _Side] = {}
        for name, applied in (("tree", {}), (args.rev, functions)):
            dsn = await stack.enter_async_context(common.fresh_database(args.dsn))
            conn = await common.bench_connect(dsn)
            stack.push_async_callback(conn.close)
            sides[name] = _Side(conn)
            await sides[name].setup(applied, args.warmup)
            log(f"{name}: set up")
        order = list(sides.values())
        for _ in range(args.rounds):
            for side in order:
                await side.round(args.cycles)
            order.reverse()  # the order alternates, so a drift in load touches both alike
        for side in sides.values():
            if await broken_invariants(side.conn):
                raise SystemExit("versus: invariant violations")
    create = {k: round(statistics.median(s.create_ms), 3) for k, s in sides.items()}
    release = {k: round(statistics.median(s.release_ms), 3) for k, s in sides.items()}
    return VersusResults(
        rev=args.rev,
        replaced_files=list(functions),
        rounds=args.rounds,
        cycles_per_round=args.cycles,
        create_ms=create,
        release_ms=release,
        tree_over_rev={
            "create": round(create["tree"] / create[args.rev], 3),
            "release": round(release["tree"] / release[args.rev], 3),
        },
    )


def run(args: argparse.Namespace) -> int:
    if min(args.rounds, args.cycles) < 1 or args.warmup < 0:
        raise SystemExit("versus: --rounds and --cycles >= 1, --warmup >= 0")
    result = asyncio.run(_run(args))
    rows = [
        [what, f"{ms['tree']:.3f}", f"{ms[args.rev]:.3f}", f"{ms['tree'] / ms[args.rev]:.2f}"]
        for what, ms in (("create", result.create_ms), ("release", result.release_ms))
    ]
    return report(result, ["per cycle", "this tree, ms", f"{args.rev}, ms", "÷"], rows)
