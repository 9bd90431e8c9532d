"""``python -m bench`` from the checkout (bench/ is a tool of the source tree, not installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import asyncpg

from support.db import run_sync
from support.repo import REPO

__all__ = ["bench_databases", "bench_figures", "run_bench"]


def run_bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` in the checkout; its exit code, stdout and stderr. The test
    server does not flush its commits (tests/conftest.py): the bench is told to run anyway."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        env={**os.environ, "RESPOOL_BENCH_ALLOW_NON_DURABLE": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def bench_databases(admin_url: str) -> set[str]:
    """Names of the ``respool_bench_*`` databases on the server (to see that a run dropped its
    own)."""

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


def bench_figures(admin_url: str, *args: str, timeout: float = 300) -> tuple[dict[str, Any], str]:
    """``python -m bench ARGS --dsn admin_url``, which must succeed and drop the databases it
    made: its figures (the JSON it prints first) and its whole output (the markdown follows)."""
    before = bench_databases(admin_url)
    run = run_bench(*args, "--dsn", admin_url, timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert bench_databases(admin_url) == before
    figures: dict[str, Any] = json.loads(run.stdout.split("\n\n|", 1)[0])
    return figures, run.stdout
