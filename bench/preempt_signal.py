"""Preemption → SIGTERM latency of ``respool run`` (docs/cli.md, ``respool run``).

``python -m bench.preempt_signal [--dsn ADMIN_DSN] [--rounds 20]``: one ``respool serve`` (with
its reconciler) on a fresh database; per round, ``respool run --gpu 1 -- CHILD`` borrows the only
GPU of a pool with a grace period, the owner of the reserved share asks for it, the reconciler
preempts the borrower, and the child records when its SIGTERM arrives. The latency is from the
request's ``preempting`` event (the server's clock, same machine) to the child's SIGTERM. Prints
p50 and max as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.wake import fresh_database, serve

CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    log = sys.argv[1]
    def on_term(signum, frame):
        with open(log, "a") as f:
            f.write(f"{os.environ['RESPOOL_REQUEST_ID']} {time.time()}\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    with open(log + ".started", "a") as f:
        f.write(os.environ["RESPOOL_REQUEST_ID"] + "\\n")
    while True:
        time.sleep(0.05)
    """
)


async def _until(check: Any, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if result := check():
            return result
        await asyncio.sleep(0.01)
    raise SystemExit(f"not true within {within} s")


def _words(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def _round(http: httpx.AsyncClient, url: str, work: Path, n: int) -> float:
    log = work / "terms"
    started = Path(f"{log}.started")
    before = len(_words(started))
    env = {**os.environ, "RESPOOL_URL": url, "RESPOOL_SUBJECT": "borrower"}
    env.pop("RESPOOL_TOKEN", None)
    wrapper = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "respool_client.run", "--gpu", "1",
        "--", sys.executable, str(work / "child.py"), str(log),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    ids = await _until(lambda: _words(started)[before:])
    victim = ids[0]
    owner = (
        await http.post("/v1/requests", json={"subject": "owner", "resources": {"gpu": 1}})
    ).json()
    code = await asyncio.wait_for(wrapper.wait(), 60)
    if code != 75:
        raise SystemExit(f"round {n}: respool run exited with {code}, expected 75 (preempted)")
    term_at = next(
        float(at) for rid, at in (line.split() for line in log.read_text().splitlines())
        if rid == victim
    )  # fmt: skip
    events = (await http.get(f"/v1/requests/{victim}/events")).json()
    preempting = next(e for e in events if e["to"] == "preempting")
    latency = term_at - datetime.fromisoformat(preempting["at"]).timestamp()
    await http.post(f"/v1/requests/{owner['id']}/release")
    return latency


async def measure(admin_dsn: str, rounds: int) -> dict[str, Any]:
    async with fresh_database(admin_dsn) as dsn:
        env = {"RESPOOL_RECONCILE_INTERVAL": "0.2"}
        with serve(dsn, reconciler=True, env=env) as url, tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "child.py").write_text(CHILD)
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                pool = {"name": "p", "capacity": {"gpu": 1}, "preemption_grace_seconds": 30}
                (await http.post("/v1/pools", json=pool)).raise_for_status()
                for subject, share in (("owner", 1), ("borrower", 0)):
                    body = {"subject": subject, "pool": "p", "reserved": {"gpu": share}}
                    (await http.post("/v1/policies", json=body)).raise_for_status()
                latencies = [await _round(http, url, work, n) for n in range(rounds)]
    ms = sorted(x * 1000 for x in latencies)
    return {
        "scenario": "preemption (preempting event) -> SIGTERM in respool run's child",
        "rounds": rounds,
        "p50_ms": round(statistics.median(ms), 1),
        "max_ms": round(ms[-1], 1),
        "min_ms": round(ms[0], 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preempt_signal", description=__doc__)
    parser.add_argument(
        "--dsn",
        default=os.environ.get(
            "RESPOOL_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL server on which a database may be created",
    )
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.dsn, args.rounds)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
