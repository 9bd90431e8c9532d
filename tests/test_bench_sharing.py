"""``python -m bench sharing`` (docs/benchmarks.md, "Shared GPUs") runs end to end on tiny
settings against the test PostgreSQL server: every create is granted at once (the bench checks
it, and that no invariant breaks), it prints one row per shape, and drops its database. The
figures are not asserted: a loaded machine says nothing about them."""

from __future__ import annotations

import pytest

from support.bench import bench_figures


@pytest.mark.slow
def test_sharing_bench_cycles_each_shape(admin_url: str) -> None:
    doc, out = bench_figures(
        admin_url, "sharing", "--nodes", "1", "--held", "3", "--cycles", "10", "--rounds", "1"
    )
    assert set(doc["median_cycles_per_s"]) == {"plain gpu:1", "shared gpu:1", "shared slice"}
    assert all(v > 0 for v in doc["median_cycles_per_s"].values())
    assert doc["ratio_to_plain"]["plain gpu:1"] == 1.0
    assert "| shared slice |" in out
