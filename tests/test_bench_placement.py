"""``python -m bench placement`` (docs/benchmarks.md, "Placement") runs its four scenarios end
to end on tiny settings against the test PostgreSQL server, checks its own results (every cycle
granted and placed, the replays agreeing with the engine's counters, every preempting pass
granting), prints its figures, and drops every database it made. The figures themselves are not
asserted: a loaded machine says nothing about them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.bench import bench_databases, run_bench

TINY = [
    "--seconds", "1", "--repeats", "1", "--clients", "1", "--nodes", "3", "--frag-nodes", "2",
    "--jobs", "40", "--queue-depth", "4", "--passes", "2", "--slice-nodes", "2",
    "--slice-jobs", "60",
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
    assert set(doc) == {"cycles", "fragmentation", "preemption", "slices"}

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


SLICES_TINY = ["--scenario", "slices", *TINY]


@pytest.mark.slow
def test_slices_replays_the_trace_with_slices_and_with_whole_gpus_only(admin_url: str) -> None:
    """Shared GPUs: the same trace replayed with slices and with whole GPUs only (the replay
    checks every grant and the nodes' memory counters against its own books), then slice and
    whole-device cycles; every database dropped."""
    before = bench_databases(admin_url)
    run = run_bench("placement", "--dsn", admin_url, *SLICES_TINY, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = _figures(run.stdout)
    assert set(doc) == {"slices"}
    x = doc["slices"]
    trace = x["trace"]
    assert trace["jobs"] == 60 and trace["nodes"] == 2 and trace["sharing"] == "mps"
    assert 0 < trace["slices"] < 60 and 0 < trace["slices_with_share"] <= trace["slices"]
    assert trace["slices"] + sum(trace["whole_jobs_by_gpus"].values()) == 60
    for mode in ("mixed", "whole"):
        replay = x[mode]
        assert replay["mode"] == mode and replay["jobs"] == 60 and replay["gpus"] == 16
        assert 0 < replay["held_memory_share"] <= 1
        settled = replay["held_memory_share_settled"]
        assert settled is None or 0 < settled <= 1
        assert 0 < replay["needed_memory_share"] <= replay["held_memory_share"] + 1e-9
        assert 0 < replay["busy_gpu_share"] <= 1
        assert replay["mean_running"] > 0 and replay["granted"] > 0
    # A slice job holds only what it needs; asked as a whole GPU it holds the whole device.
    assert abs(x["mixed"]["held_memory_share"] - x["mixed"]["needed_memory_share"]) < 1e-9
    assert x["whole"]["needed_memory_share"] < x["whole"]["held_memory_share"]
    assert x["concurrency_ratio"] > 0
    assert set(x["cycles"]) == {"whole", "slice", "whole_on_shared"}
    for kind in x["cycles"].values():
        assert kind["1"]["median"] > 0
    assert x["slice_over_whole"]["1"] > 0

    for row in (
        "| busy GPU memory-time, slices and whole GPUs |",
        "| busy GPU memory-time, whole GPUs only |",
        "| jobs running at once: slices ÷ whole GPUs only |",
        "| cycles/s, 1 client: slice ÷ whole device |",
    ):
        assert row in run.stdout
    assert bench_databases(admin_url) == before


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--preempt-gpus", "9"], "--preempt-gpus"),
        (["--jobs", "0"], "--jobs"),
        (["--slice-jobs", "0"], "--slice-jobs"),
        (["--slice-nodes", "0"], "--slice-nodes"),
        (["--scenario", "nowhere"], "--scenario"),
        (["--clients", "1,x"], "--clients"),
    ],
)
def test_bad_arguments_are_refused_naming_the_option(args: list[str], named: str) -> None:
    run = run_bench("placement", *args)
    assert run.returncode != 0
    assert named in run.stderr
    assert "Traceback" not in run.stderr
