"""``python -m bench depth`` (docs/benchmarks.md, "Grant cost against queue depth") runs end to
end on tiny settings against the test PostgreSQL server: every sample's release ends a holder and
grants the queue's head (the bench checks that the pool stays full and no invariant breaks),
prints one row per depth, and drops its databases. The figures are not asserted: a loaded
machine says nothing about them."""

from __future__ import annotations

import pytest

from support.bench import bench_figures


@pytest.mark.slow
def test_depth_bench_times_a_granting_release_at_each_depth(admin_url: str) -> None:
    doc, out = bench_figures(
        admin_url, "depth", "--gpus", "4", "--samples", "10", "--depths", "0,1,30"
    )
    assert doc["depths"] == [0, 1, 30]
    assert len(doc["median_ms"]) == len(doc["p90_ms"]) == 3
    assert all(m > 0 for m in doc["median_ms"])
    assert doc["ratio_to_empty"][0] == 1.0
    assert doc["ratio_to_one"][1] == 1.0  # a queue of one: a grant with nothing else waiting
    assert "| 30 |" in out
