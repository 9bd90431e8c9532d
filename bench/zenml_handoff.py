"""Release → next-step-start hand-off through a real ZenML server backed by respool.

``python -m bench.zenml_handoff [--runs 10] [--hold 3] [--database-url URL]``

Each run is one dynamic pipeline with two steps that both ask for the only GPU of the pool. For
each run it reports ``second step's start − first step's release``. The release is respool's
``finished_at`` of the first request, when ZenML's ``release_step_run_resources`` reached respool.
The start is the wall-clock time at the top of the second step's body. Both clocks are on this
machine. The figure includes ZenML's polling back-off (1 s doubling to 20 s, with jitter), which
depends on how long the second step had waited, so ``--hold`` matters. It needs the ZenML venv
(``integrations/zenml/ci-install.sh``) and a PostgreSQL server on which it may create a database
(``--database-url``, default ``RESPOOL_TEST_DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import asyncpg

from app.db.dsn import with_database
from tests.zenml_e2e.harness import running, zenml_available


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds each step holds the GPU")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("RESPOOL_TEST_DATABASE_URL"),
        help="admin URL of a PostgreSQL server (a database is created and dropped on it)",
    )
    args = parser.parse_args()
    why = zenml_available()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    if not args.database_url:
        print("cannot run: give --database-url or RESPOOL_TEST_DATABASE_URL", file=sys.stderr)
        return 2
    name = f"respool_zenml_bench_{os.getpid()}"
    asyncio.run(_admin(args.database_url, f'CREATE DATABASE "{name}"'))
    handoffs: list[float] = []
    try:
        db_url = with_database(args.database_url, name)
        with tempfile.TemporaryDirectory() as tmp, running(db_url, Path(tmp)) as zen:
            zen.rp("POST", "/v1/pools", json={"name": "gpus", "capacity": {"gpu": 1}})
            zen.rp(
                "POST",
                "/v1/policies",
                json={"subject": "orchestrator:default", "pool": "gpus", "reserved": {"gpu": 1}},
            )
            for i in range(args.runs):
                t0 = time.monotonic()
                result = zen.drive("run", "pair", "default", "1", str(args.hold))
                if result["status"] != "completed":
                    print(result["output"][-3000:], file=sys.stderr)
                    return 1
                reqs = sorted(zen.requests_of_run(result["run"]), key=lambda r: r["allocated_at"])
                if len(reqs) != 2:
                    print(
                        f"run {result['run']}: {len(reqs)} respool requests, not 2 (did the"
                        " ZenML server load the plug-in?)",
                        file=sys.stderr,
                    )
                    return 1
                released = datetime.fromisoformat(reqs[0]["finished_at"]).timestamp()
                starts = sorted(s["at"] for s in result["step_log"] if s["event"] == "start")
                handoff = starts[1] - released
                handoffs.append(handoff)
                print(
                    f"run {i + 1:2d}: hand-off {handoff:6.2f} s"
                    f" (pipeline {time.monotonic() - t0:5.1f} s)",
                    flush=True,
                )
    finally:
        asyncio.run(_admin(args.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    print(
        f"zenml hand-off over {len(handoffs)} runs (hold {args.hold:g} s):"
        f" p50 {statistics.median(handoffs):.2f} s, max {max(handoffs):.2f} s,"
        f" min {min(handoffs):.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
