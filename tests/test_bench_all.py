"""``python -m bench all`` runs every scenario end to end on tiny settings against the test
PostgreSQL server, writes the report and its JSON, and drops every database it created. The
figures themselves are not asserted (a loaded CI machine says nothing about them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.bench import bench_databases, run_bench

TINY = [
    "--seconds",
    "1",
    "--repeats",
    "1",
    "--clients",
    "1",
    "--subjects",
    "2",
    "--pools",
    "2",
    "--wakes",
    "3",
    "--waiters",
    "12",
    "--waiter-capacity",
    "5",
    "--queued",
    "8,40",
    "--reconcile-pools",
    "1,2",
    "--churn",
    "2",
    "--passes",
    "2",
]


@pytest.mark.slow
def test_bench_all_runs_end_to_end(admin_url: str, tmp_path: Path) -> None:
    before = bench_databases(admin_url)
    out, raw = tmp_path / "benchmarks.md", tmp_path / "bench.json"
    out.write_text(
        "# Benchmarks\n\nkept above\n\n<!-- bench:begin -->\nold\n<!-- bench:end -->\nkept below\n"
    )
    run = run_bench(
        "all", "--dsn", admin_url, *TINY, "--out", str(out), "--json", str(raw), timeout=240
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(raw.read_text())
    # The report records the server's durability settings (the test server's are off).
    assert {"fsync", "synchronous_commit", "full_page_writes"} <= set(doc["server"])
    assert set(doc["cycles"]) == {"update", "notify", "engine"}
    assert doc["cycles"]["engine"]["1"]["median"] > 0
    assert doc["http"]["cycles"]["1"]["median"] > 0
    assert doc["wake"]["wake"]["n"] == 3
    assert doc["waiters"]["correct"], doc["waiters"]["problems"]
    assert doc["waiters"]["granted"] == 5
    assert set(doc["reconcile"]) == {
        "8 queued / 1 pools",
        "40 queued / 1 pools",
        "8 queued / 2 pools",
        "40 queued / 2 pools",
    }
    assert "jobs_per_s" in doc["peer"]  # None when pgqueuer is not installed
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nkept above\n") and text.endswith("kept below\n")
    assert "old" not in text
    for heading in ("### Targets", "### 1–2.", "### 3.", "### 4.", "### 5.", "### 6.", "### 7."):
        assert heading in text
    assert bench_databases(admin_url) == before  # every database it made is gone


def test_bench_refuses_bad_arguments() -> None:
    run = run_bench("all", "--waiters", "5", "--waiter-capacity", "5")
    assert run.returncode != 0
    assert "--waiter-capacity" in run.stderr
