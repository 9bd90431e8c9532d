"""``python -m bench placement`` (docs/benchmarks.md, "Placement") runs its three scenarios end
to end on tiny settings against the test PostgreSQL server, checks its own results (every cycle
granted and placed, the replay agreeing with the engine's counters, every preempting pass
granting), prints its figures, and drops every database it made. The figures themselves are not
asserted: a loaded machine says nothing about them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.bench import bench_databases, run_bench

TINY = [
    "--seconds", "1", "--repeats", "1", "--clients", "1", "--nodes", "3", "--frag-nodes", "2",
    "--jobs", "40", "--queue-depth", "4", "--passes", "2",
]  # fmt: skip


def _figures(stdout: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(stdout.split("\n\n|", 1)[0])
    return doc


@pytest.mark.slow
def test_placement_bench_runs_every_scenario_and_prints_its_figures(admin_url: str) -> None:
    before = bench_databases(admin_url)
    run = run_bench("placement", "--dsn", admin_url, *TINY, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = _figures(run.stdout)
    assert set(doc) == {"cycles", "fragmentation", "preemption"}

    cycles = doc["cycles"]
    assert cycles["nodes"]["1"]["median"] > 0 and cycles["abstract"]["1"]["median"] > 0
    assert cycles["nodes_over_abstract"]["1"] > 0

    frag = doc["fragmentation"]
    assert set(frag) == {"pack", "spread", "abstract"}
    for mode in frag.values():
        assert mode["jobs"] == 40 and mode["gpus"] == 16
        assert 0 < mode["busy_share"] <= 1
        assert mode["fragmentation_events"] == sum(mode["events_by_gpus"].values())
        assert set(mode["events_by_gpus"]) == {"1", "2", "4", "8"}
        assert mode["simulated_hours"] > 0
        assert sum(mode["granted"].values()) > 0
    assert frag["abstract"]["fragmentation_events"] == 0  # abstract units cannot fragment

    pre = doc["preemption"]
    assert (pre["nodes"], pre["gpus"], pre["passes"]) == (3, 24, 2)
    assert pre["node_p50_ms"] > 0 and pre["abstract_p50_ms"] > 0
    assert pre["node_victims"]["low"] >= 1

    # The markdown rows for docs/benchmarks.md, every target named.
    for row in (
        "| cycles/s, 1 client: nodes ÷ abstract |",
        "| busy GPU-time, pack |",
        "| busy GPU-time, spread |",
        "| fragmentation, pack |",
        "| preempting pass, 3 nodes",
    ):
        assert row in run.stdout
    assert bench_databases(admin_url) == before  # every database it made is gone


@pytest.mark.slow
def test_one_scenario_runs_alone(admin_url: str) -> None:
    run = run_bench(
        "placement", "--dsn", admin_url, "--scenario", "fragmentation", *TINY, timeout=300
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert set(_figures(run.stdout)) == {"fragmentation"}


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--preempt-gpus", "9"], "--preempt-gpus"),
        (["--jobs", "0"], "--jobs"),
        (["--scenario", "nowhere"], "--scenario"),
        (["--clients", "1,x"], "--clients"),
    ],
)
def test_bad_arguments_are_refused_naming_the_option(args: list[str], named: str) -> None:
    run = run_bench("placement", *args)
    assert run.returncode != 0
    assert named in run.stderr
    assert "Traceback" not in run.stderr
