"""``/metrics`` after the scripted history (tests/support/scenario.py): every number is known."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.api.metrics import EventTally
from support import scenario
from support.db import direct
from support.scenario import D1
from support.server import Server, running_server

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "respool.json"

COUNTER_SUFFIXES = ("_total", "_count", "_bucket", "_sum")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def counters(samples: Samples) -> Samples:
    return {k: v for k, v in samples.items() if k[0].endswith(COUNTER_SUFFIXES)}


async def scrape(srv: Server) -> Samples:
    r = await srv.client.get("/metrics")
    assert r.status_code == 200
    return parse(r.text)


@pytest.fixture
async def srv(db_url: str) -> AsyncIterator[Server]:
    # metrics_cache_seconds=0: every scrape reads the database (the cache is tested in
    # tests/api/test_hardening_edges.py).
    async with (
        direct(db_url) as conn,
        running_server(db_url, metrics_cache_seconds=0.0) as server,
    ):
        # Count the scripted history too (it happened "before" this process started).
        server.app.state.event_tally = EventTally(started=D1)
        await scenario.history(conn)
        await scenario.live(conn)
        yield server


async def test_state_gauges(srv: Server) -> None:
    m = await scrape(srv)
    gpus = {"pool": "gpus", "key": "gpu"}
    assert get(m, "respool_pool_capacity", **gpus) == 8
    assert get(m, "respool_pool_allocated", **gpus) == 6  # b3
    assert get(m, "respool_pool_free", **gpus) == 2
    assert get(m, "respool_pool_reserved", **gpus) == 4  # team-a
    assert get(m, "respool_pool_borrowed", **gpus) == 6  # team-b holds 6, reserves 0
    assert get(m, "respool_pool_queued_demand", **gpus) == 4  # c2
    grace = {"pool": "grace", "key": "gpu"}
    assert get(m, "respool_pool_allocated", **grace) == 2  # e1, still preempting
    assert get(m, "respool_pool_reserved", **grace) == 2
    assert get(m, "respool_pool_queued_demand", **grace) == 2  # f1
    assert get(m, "respool_pool_capacity", pool="gpus", key="step_run") is None  # untracked
    assert get(m, "respool_pool_allocated", pool="gpus", key="step_run") == 1

    b = {"pool": "gpus", "subject": "team-b", "key": "gpu"}
    assert get(m, "respool_policy_used", **b) == 6
    assert get(m, "respool_policy_borrowed", **b) == 6
    assert get(m, "respool_policy_limit", **b) == 8
    assert get(m, "respool_policy_reserved", pool="gpus", subject="team-a", key="gpu") == 4
    assert get(m, "respool_policy_limit", pool="gpus", subject="team-a", key="gpu") is None

    for pool, n in {"gpus": 1, "tiny": 1, "grace": 1, "cpu": 0}.items():
        assert get(m, "respool_queue_length", pool=pool) == n, pool
    assert get(m, "respool_queue_oldest_wait_seconds", pool="tiny") > 365 * 86400  # type: ignore[operator]

    stored = {
        "queued": 3, "allocated": 2, "preempting": 1, "released": 3, "preempted": 1,
        "expired": 1, "cancelled": 1, "rejected": 1,
    }  # fmt: skip
    for status, n in stored.items():
        assert get(m, "respool_requests", status=status) == n, status
    for inv in ("I1", "I2", "I3", "I4"):
        assert get(m, "respool_invariant_violations", invariant=inv) == 0
    assert get(m, "respool_database_up") == 1
    assert get(m, "respool_listener_up") == 1


async def test_event_counters_and_wait_histogram(srv: Server) -> None:
    m = await scrape(srv)
    assert get(m, "respool_preemptions_total", pool="gpus", reason="reclaim") == 1  # b1
    assert get(m, "respool_preemptions_total", pool="grace", reason="reclaim") == 1  # e1
    finished = {"released": 3, "preempted": 1, "expired": 1, "cancelled": 1, "rejected": 1}
    for status, n in finished.items():
        assert get(m, "respool_requests_finished_total", status=status) == n, status

    # gpus grants: b1, b2, x1, k1, b3 at once; a1 after 5400 s.
    h = "respool_allocation_wait_seconds"
    assert get(m, f"{h}_count", pool="gpus") == 6
    assert get(m, f"{h}_sum", pool="gpus") == 5400
    assert get(m, f"{h}_bucket", pool="gpus", le="1.0") == 5
    assert get(m, f"{h}_bucket", pool="gpus", le="3600.0") == 5
    assert get(m, f"{h}_bucket", pool="gpus", le="7200.0") == 6
    for pool in ("cpu", "tiny", "grace"):
        assert get(m, f"{h}_count", pool=pool) == 1, pool

    # A second scrape counts nothing twice.
    again = await scrape(srv)
    assert counters(again) == counters(m)


async def test_counters_move_with_new_events_and_survive_pruning(srv: Server) -> None:
    before = await scrape(srv)
    c = srv.client
    r = await c.post("/v1/requests", json={"subject": "team-c", "pool": "cpu",
                                           "resources": {"mcpu": 1000}})  # fmt: skip
    assert r.status_code == 201 and r.json()["status"] == "allocated"
    rid = UUID(r.json()["id"])
    assert (await c.post(f"/v1/requests/{rid}/release")).json()["status"] == "released"
    counted = await scrape(srv)
    r = await c.post("/v1/retention/prune", json={"older_than": "0s"})
    assert r.json()["pruned"] == 8  # the 7 scripted terminal requests and this one

    after = await scrape(srv)
    assert counters(after) == counters(counted)
    released = ("respool_requests_finished_total", frozenset({("status", "released")}))
    assert after[released] == before[released] + 1
    cpu_count = ("respool_allocation_wait_seconds_count", frozenset({("pool", "cpu")}))
    assert after[cpu_count] == before[cpu_count] + 1
    for key, value in counters(before).items():  # pruning history never lowers a counter
        assert after[key] >= value, key
    assert get(after, "respool_requests", status="released") == 0  # the stored rows are gone


async def test_grafana_dashboard_uses_only_exported_metrics(srv: Server) -> None:
    exported = {name for name, _ in await scrape(srv)}
    doc = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", []) if "expr" in t]
    assert exprs, "no panel queries"
    used = {n for e in exprs for n in re.findall(r"\brespool_[a-z_]+", e)}
    assert used, exprs
    assert used <= exported, used - exported
