"""``python -m bench wake`` runs end to end (a few rounds) against the test PostgreSQL server,
and drops the database it created. The timings themselves are not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import asyncpg

from tests.conftest import run_sync

REPO = Path(__file__).resolve().parent.parent


def _bench_databases(admin_url: str) -> set[str]:
    async def names() -> set[str]:
        conn = await asyncpg.connect(admin_url)
        try:
            rows = await conn.fetch(
                "SELECT datname FROM pg_database WHERE datname LIKE 'respool\\_bench\\_%'"
            )
        finally:
            await conn.close()
        return {r["datname"] for r in rows}

    return run_sync(names)


def test_bench_wake_runs_end_to_end(admin_url: str) -> None:
    before = _bench_databases(admin_url)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "wake",
            "--wakes",
            "5",
            "--warmup",
            "1",
            "--dsn",
            admin_url,
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert set(result) == {"wake", "wake_httpx", "raw_notify"}
    for summary in result.values():
        assert summary["n"] == 5
        ordered = [summary[k] for k in ("min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms")]
        assert ordered == sorted(ordered), summary
    assert _bench_databases(admin_url) == before  # the run dropped its database


def test_bench_wake_refuses_bad_arguments() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "wake", "--wakes", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "--wakes must be >= 1" in run.stderr
