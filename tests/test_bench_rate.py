"""``python -m bench rate`` (docs/benchmarks.md, "Rate keys") runs its three phases end to end
against the test PostgreSQL server with a few callers, and drops the database it created. The
figures are not asserted, only that every phase produced some and no invariant broke."""

from __future__ import annotations

import json

import pytest

from support.bench import bench_databases, run_bench


@pytest.mark.slow
def test_bench_rate_runs_end_to_end(admin_url: str) -> None:
    before = bench_databases(admin_url)
    run = run_bench(
        "rate", "--dsn", admin_url, "--callers", "8", "--seconds", "2",
        "--saturated-seconds", "6", "--window", "2", "--amount", "4000", "--estimate", "500",
        timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout[: run.stdout.index("\n}\n") + 2])
    assert result["reservations_per_s"] > 0 and result["windows"] >= 1
    assert result["admitted_pct_max"] <= 100.0
    assert result["violations"] == 0
    assert result["cpu_ms_bench"] > 0 and result["cpu_ms_serve"] > 0  # where a cycle's CPU went
    assert bench_databases(admin_url) == before  # the run dropped its database


def test_bench_rate_refuses_bad_arguments() -> None:
    run = run_bench("rate", "--window", "5", "--saturated-seconds", "10")
    assert run.returncode != 0
    assert "--saturated-seconds >= 3 windows" in run.stderr
