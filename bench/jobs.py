"""Jobs run by node agents (docs/jobs.md): ``respool submit`` to the first line of the job's
output on a free node, and 1,000 queued ``true`` jobs drained by two agents (jobs per second).

``python -m bench jobs [--dsn ADMIN_DSN] [--rounds 20] [--jobs 1000]``: one ``respool serve``
(with its reconciler, auth on) on a fresh database; a pool of two 8-GPU nodes and one
``respool agent`` per node (token of role agent bound to it), on this machine. The server must
be durable (fsync, synchronous_commit and full_page_writes on), unless
``RESPOOL_BENCH_ALLOW_NON_DURABLE=1`` (then the figures are not comparable, and it says so).

* latency: per round, ``respool submit --gpu 1 -- python -c "print('hi')"`` (the process, as a
  user runs it) is started, then the job's log is long-polled until the job's own line ``hi``
  is readable (the agent's status lines in the log do not count); the figure is from starting
  ``respool submit`` to that line (p50, p95, min, max). Beside it: how long the ``respool
  submit`` process took to answer, and the same path with the create made over HTTP (no
  process start): create → the agent's claim → the first output line;
* drain: ``--jobs`` jobs of 1 GPU running ``true`` are created in one batch while both agents
  run; the figure is jobs / seconds from the create to the last release, with the median job's
  grant → claim and claim → release.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
from typing import Any

import asyncpg
import httpx

from app.db import tokens
from app.db.connect import APP_CLI, connect
from bench.common import durable_server, load_average, log
from bench.wake import fresh_database, serve

SUMMARY = "jobs: respool submit to the first output line; 1,000 jobs drained by two agents"
ADMIN = "bench-admin-token-jobs-0123456789abcdef"
BATCH = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        default=os.environ.get(
            "RESPOOL_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL server on which a database may be created",
    )
    parser.add_argument("--rounds", type=int, default=20, help="latency rounds")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs to drain")


def _respool() -> list[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "respool")
    return [beside] if os.path.exists(beside) else ["respool"]


async def _agent_ready(http: httpx.AsyncClient, node: str) -> bool:
    doc = (await http.get(f"/v1/nodes/{node}")).json()
    return bool(doc.get("agent") == "ready")


async def _until(check: Any, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise SystemExit(f"not true within {within} s")


PRINT_HI = [sys.executable, "-c", "print('hi')"]


async def _first_line(http: httpx.AsyncClient, rid: str) -> None:
    """Until the job's own stdout line is readable (long-polls the log)."""
    after = -1
    while True:
        page = (
            await http.get(
                f"/v1/requests/{rid}/logs", params={"wait": 30, "after": after}, timeout=45
            )
        ).json()
        if any(c["stream"] == "stdout" and "hi" in c["data"] for c in page["chunks"]):
            return
        if page["done"]:
            raise SystemExit(f"job {rid} ended without its output line")
        after = page["next"]


async def _latency(http: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """(seconds from starting ``respool submit`` to the job's line, of them the process's)."""
    env = {**os.environ, "RESPOOL_URL": url, "RESPOOL_TOKEN": ADMIN}
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *_respool(), "submit", "-s", "bench", "--pool", "p", "--gpu", "1", "--", *PRINT_HI,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    answered = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"respool submit failed: {err.decode()}")
    await _first_line(http, out.decode().strip())
    return time.monotonic() - started, answered


async def _api_latency(http: httpx.AsyncClient, conn: asyncpg.Connection) -> tuple[float, float]:
    """(seconds from a create over HTTP to the job's line, of them to the agent's claim)."""
    body = {"subject": "bench", "pool": "p", "resources": {"gpu": 1}, "job": {"command": PRINT_HI}}
    started = time.monotonic()
    answer = await http.post("/v1/requests", json=body)
    answer.raise_for_status()
    rid = answer.json()["id"]
    await _first_line(http, rid)
    took = time.monotonic() - started
    to_claim = await conn.fetchval(
        "SELECT extract(epoch FROM claimed_at - created_at) FROM respool.requests WHERE id = $1",
        rid,
    )
    return took, float(to_claim)


def _ms(values: list[float]) -> dict[str, Any]:
    ms = sorted(x * 1000 for x in values)
    p95 = ms[min(len(ms) - 1, max(0, round(0.95 * len(ms)) - 1))]
    return {
        "rounds": len(ms),
        "p50": round(statistics.median(ms), 1),
        "p95": round(p95, 1),
        "min": round(ms[0], 1),
        "max": round(ms[-1], 1),
    }


async def _drain(http: httpx.AsyncClient, dsn: str, n: int) -> dict[str, Any]:
    member = {"subject": "bench", "pool": "p", "resources": {"gpu": 1},
              "job": {"command": ["true"]}}  # fmt: skip
    conn = await asyncpg.connect(dsn)
    try:
        before = await conn.fetchval(
            "SELECT count(*) FROM respool.requests WHERE status = 'released'"
        )
        started = time.monotonic()
        left = n
        while left:
            size = min(left, BATCH)
            answer = await http.post(
                "/v1/requests/batch", json={"members": [member] * size}, timeout=120
            )
            answer.raise_for_status()
            left -= size
        while True:
            done = await conn.fetchval(
                "SELECT count(*) FROM respool.requests WHERE status = 'released'"
            )
            if done - before >= n:
                break
            await asyncio.sleep(0.1)
        seconds = time.monotonic() - started
        steps = await conn.fetchrow(
            "SELECT percentile_cont(0.5) WITHIN GROUP"
            "         (ORDER BY extract(epoch FROM claimed_at - allocated_at)) AS claim,"
            "       percentile_cont(0.5) WITHIN GROUP"
            "         (ORDER BY extract(epoch FROM finished_at - claimed_at)) AS run"
            "  FROM (SELECT * FROM respool.requests WHERE status = 'released'"
            "         ORDER BY finished_at DESC LIMIT $1) r",
            n,
        )
    finally:
        await conn.close()
    return {
        "jobs": n,
        "seconds": round(seconds, 1),
        "jobs_per_second": round(n / seconds, 1),
        "median_grant_to_claim_ms": round(float(steps["claim"]) * 1000, 1),
        "median_claim_to_release_ms": round(float(steps["run"]) * 1000, 1),
    }


async def measure(admin_dsn: str, rounds: int, jobs: int) -> dict[str, Any]:
    info = await durable_server(admin_dsn)
    async with fresh_database(admin_dsn) as dsn:
        env = {"RESPOOL_RECONCILE_INTERVAL": "0.2", "RESPOOL_AUTH": "on",
               "RESPOOL_ADMIN_TOKEN": ADMIN}  # fmt: skip
        with serve(dsn, reconciler=True, env=env) as url:
            headers = {"Authorization": f"Bearer {ADMIN}"}
            async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as http:
                (await http.post("/v1/pools", json={"name": "p"})).raise_for_status()
                for node in ("n1", "n2"):
                    body = {"name": node, "pool": "p",
                            "devices": {"gpu": [str(i) for i in range(8)]}}  # fmt: skip
                    (await http.post("/v1/nodes", json=body)).raise_for_status()
                body = {"subject": "bench", "pool": "p"}
                (await http.post("/v1/policies", json=body)).raise_for_status()
                conn = await connect(dsn, application_name=APP_CLI)
                try:
                    secrets = {}
                    for node in ("n1", "n2"):
                        secrets[node], _ = await tokens.create_token(
                            conn, name=f"agent-{node}", role="agent", node=node
                        )
                finally:
                    await conn.close()
                agents = []
                for node in ("n1", "n2"):
                    agent_env = {**os.environ, "RESPOOL_URL": url, "RESPOOL_TOKEN": secrets[node]}
                    agents.append(
                        await asyncio.create_subprocess_exec(
                            *_respool(),
                            "agent",
                            "--node",
                            node,
                            env=agent_env,
                            stdout=asyncio.subprocess.DEVNULL,
                            stderr=asyncio.subprocess.DEVNULL,
                        )  # fmt: skip
                    )
                try:
                    for node in ("n1", "n2"):
                        await _until(lambda node=node: _agent_ready(http, node))
                    log(f"load average before: {load_average()}")
                    submitted = [await _latency(http, url) for _ in range(rounds)]
                    conn = await asyncpg.connect(dsn)
                    try:
                        api = [await _api_latency(http, conn) for _ in range(rounds)]
                    finally:
                        await conn.close()
                    drain = await _drain(http, dsn, jobs)
                    log(f"load average after: {load_average()}")
                finally:
                    for agent in agents:
                        agent.send_signal(signal.SIGTERM)
                    for agent in agents:
                        await asyncio.wait_for(agent.wait(), 60)
    return {
        "scenario": "jobs run by two node agents",
        "server": info.line(),
        "submit_to_first_output_ms": _ms([total for total, _ in submitted]),
        "submit_process_ms": _ms([answered for _, answered in submitted]),
        "create_to_first_output_ms": _ms([total for total, _ in api]),
        "create_to_claim_ms": _ms([claim for _, claim in api]),
        "drain": drain,
    }


def run(args: argparse.Namespace) -> int:
    print(json.dumps(asyncio.run(measure(args.dsn, args.rounds, args.jobs)), indent=2))
    return 0
