"""``python -m bench eta`` (docs/benchmarks.md, "ETA calibration") replays a small synthetic
trace twice in one run, with this checkout's estimator and with the earlier one, prints the
share of real waits within p50 and p90 for each, and drops the databases it made. The shares
themselves are not asserted (a tiny trace says little about them)."""

from __future__ import annotations

import json

import pytest

from support.bench import bench_databases, run_bench


@pytest.mark.slow
def test_bench_eta_reports_calibration_before_and_after(admin_url: str) -> None:
    before = bench_databases(admin_url)
    run = run_bench("eta", "--jobs", "120", "--dsn", admin_url, "--json", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert set(doc) == {"before", "after"}
    for figures in doc.values():
        assert figures["jobs"] == 120 and figures["queued"] > 0
        for reading in ("on_arrival", "while_waiting"):
            cal = figures[reading]
            assert cal["estimates"] > 0, (reading, figures)
            assert 0 <= cal["under_p50"] <= cal["under_p90"] <= 1, (reading, figures)
    # The same trace and the same grants: only the estimator differs, and the earlier one gave
    # estimates from the first recorded hold on, this one from the tenth.
    assert doc["before"]["queued"] == doc["after"]["queued"]
    assert doc["after"]["on_arrival"]["estimates"] <= doc["before"]["on_arrival"]["estimates"]
    assert bench_databases(admin_url) == before  # the run dropped its databases

    table = run_bench("eta", "--jobs", "40", "--before", "none", "--dsn", admin_url, timeout=300)
    assert table.returncode == 0, table.stdout[-3000:] + table.stderr[-3000:]
    assert "| after | on arrival |" in table.stdout and "| before" not in table.stdout


def test_bench_eta_refuses_bad_arguments() -> None:
    run = run_bench("eta", "--before", "no-such-commit")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        "--before: no sql/functions/037_eta.sql at 'no-such-commit' in this checkout's git history"
    ]
    jobs = run_bench("eta", "--jobs", "0")
    assert jobs.returncode != 0 and "--jobs" in jobs.stderr and "Traceback" not in jobs.stderr
