"""``python -m bench versus`` (docs/benchmarks.md, "The engine's cycle, side by side") runs end to
end on tiny settings against the test PostgreSQL server: against HEAD it lists the function files
HEAD has otherwise, times creates and releases on both sides, and drops its databases. The
figures are not asserted: a loaded machine says nothing about them."""

from __future__ import annotations

import subprocess

import pytest

from support.bench import bench_figures, run_bench
from support.repo import REPO


def _git_checkout() -> bool:
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "HEAD"], cwd=REPO, capture_output=True, check=False
    )
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _git_checkout(), reason="versus reads another commit: needs a git checkout")
def test_versus_bench_times_both_sides_and_names_the_files_it_replaced(admin_url: str) -> None:
    doc, out = bench_figures(
        admin_url, "versus", "--rev", "HEAD", "--rounds", "2", "--cycles", "5", "--warmup", "10"
    )
    changed = subprocess.run(
        ["git", "diff", "--name-only", "--diff-filter=MD", "HEAD", "--", "sql/functions"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert doc["replaced_files"] == changed
    assert set(doc["create_ms"]) == set(doc["release_ms"]) == {"tree", "HEAD"}
    assert all(ms > 0 for ms in [*doc["create_ms"].values(), *doc["release_ms"].values()])
    assert doc["tree_over_rev"]["create"] > 0
    assert "| create |" in out and "| release |" in out


def test_versus_refuses_a_commit_it_cannot_read(admin_url: str) -> None:
    run = run_bench("versus", "--dsn", admin_url, "--rev", "no-such-commit-0000", timeout=120)
    assert run.returncode != 0
    assert "versus: git" in run.stderr
    assert "Traceback" not in run.stderr
