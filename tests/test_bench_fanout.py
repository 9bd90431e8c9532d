"""``python -m bench baseline|batch|sweep|burst|gang`` run end to end on tiny settings against
the test PostgreSQL server, check their own results, and drop every database they made. The
figures are not asserted (a loaded machine says nothing about them)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from support.bench import bench_databases, run_bench
from support.db import run_sync

pytestmark = pytest.mark.slow


def _bench(admin_url: str, *args: str) -> dict[str, Any]:
    run = run_bench(*args, "--dsn", admin_url, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc: dict[str, Any] = json.loads(run.stdout.split("\n\n|", 1)[0])
    assert "\n| " in run.stdout  # the markdown row for docs/benchmarks.md
    return doc


@pytest.mark.parametrize(
    "args",
    [
        ["baseline", "--seconds", "1", "--repeats", "1", "--clients", "1,2", "--pools", "2",
         "--subjects", "2"],
        ["batch", "--batches", "2", "--batch-size", "25", "--singles", "40", "--clients", "8"],
        ["sweep", "--steps", "24", "--gpus", "8"],
        ["sweep", "--steps", "24", "--gpus", "8", "--holds", "30-300", "--time-scale", "0.005"],
        ["burst", "--creates", "60", "--connections", "12", "--db-pool", "2"],
        ["gang", "--gangs", "3", "--gang-size", "4"],
    ],
)  # fmt: skip
def test_fanout_scenarios_run_end_to_end(admin_url: str, args: list[str]) -> None:
    before = bench_databases(admin_url)
    doc = _bench(admin_url, *args)
    if args[0] == "baseline":
        assert set(doc["engine_over_minimal"]) == {"1", "2"}
        assert doc["minimal"]["1"]["median"] > 0 and doc["engine"]["2"]["median"] > 0
    elif args[0] == "batch":
        assert (doc["batches"], doc["batch_size"]) == (2, 25)
        assert doc["engine_overall"] > 0 and doc["http_overall"] > 0
        assert (doc["singles"], doc["clients"]) == (40, 8) and doc["singles_per_s"] > 0
        assert doc["singles_over_batch"] == doc["singles_per_s"] / doc["http_overall"]
    elif args[0] == "gang":
        assert (doc["gangs"], doc["gang_size"]) == (3, 4)
        assert doc["granted_at_create_per_s"] > 0 and doc["granted_by_release_per_s"] > 0
    elif args[0] == "burst":
        assert doc["correct"], doc["problems"]
        assert (doc["creates"], doc["connections"], doc["db_pool"]) == (60, 12, 2)
        assert doc["unanswered"] == 0 and doc["transport_errors"] == {}
        assert doc["answers_503"] == 0
        assert doc["statuses"].get("201", 0) + doc["statuses"].get("200", 0) == 60
    else:
        # The sweep runs to the end: every step allocated once and released.
        assert doc["correct"], doc["problems"]
        assert doc["failed_steps"] == 0 and not doc["timed_out"]
        assert doc["answers_503"] == 0
        assert doc["steps"] == 24 and doc["makespan_s"] > 0 and doc["ideal_s"] > 0
        if "--time-scale" in args:  # 30-300 s compressed 200 times: 0.15-1.5 s each
            assert doc["holds_s"] == [30, 300] and doc["time_scale"] == 0.005
            assert 24 * 0.15 / 8 <= doc["ideal_s"] <= 24 * 1.5 / 8 + 1.5
    # Nothing of ours is left behind. The server is shared: another run's databases may come
    # and go meanwhile, so only a new database that nobody is connected to counts.
    assert _idle(admin_url, bench_databases(admin_url) - before) == set()


def _idle(admin_url: str, names: set[str]) -> set[str]:
    async def idle() -> set[str]:
        conn = await asyncpg.connect(admin_url)
        try:
            busy = await conn.fetch(
                "SELECT DISTINCT datname FROM pg_stat_activity WHERE datname = ANY($1::text[])",
                list(names),
            )
        finally:
            await conn.close()
        return names - {r["datname"] for r in busy}

    return run_sync(idle) if names else set()
