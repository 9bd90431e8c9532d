"""``python -m bench wake`` runs end to end (a few rounds) against the test PostgreSQL server,
and drops the database it created. The timings themselves are not asserted."""

from __future__ import annotations

import json

import pytest

from support.bench import bench_databases, run_bench


@pytest.mark.slow
def test_bench_wake_runs_end_to_end(admin_url: str) -> None:
    before = bench_databases(admin_url)
    run = run_bench(
        "wake",
        "--wakes",
        "5",
        "--warmup",
        "1",
        "--dsn",
        admin_url,
        "--json",
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert set(result) == {"wake", "wake_httpx", "raw_notify"}
    for summary in result.values():
        assert summary["n"] == 5
        ordered = [summary[k] for k in ("min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms")]
        assert ordered == sorted(ordered), summary
    assert bench_databases(admin_url) == before  # the run dropped its database


def test_bench_wake_refuses_bad_arguments() -> None:
    run = run_bench("wake", "--wakes", "0")
    assert run.returncode != 0
    assert "--wakes must be >= 1" in run.stderr
