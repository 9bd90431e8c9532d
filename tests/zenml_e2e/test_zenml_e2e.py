"""End to end with real ZenML (docs/zenml.md): a local ZenML server (OAuth2 auth on) whose
resource-pool store is respool_zenml, a respool server, and dynamic pipelines asking for GPUs
through ``ResourceSettings``.

Pool ``gpus`` has 1 GPU. ``orchestrator:default`` (ZenML's local orchestrator: inline steps,
non-preemptible) holds a reserved share of 1; ``orchestrator:iso`` (a subprocess orchestrator:
isolated, preemptible steps) may borrow; ``orchestrator:free`` has no policy.
``orchestrator:nodes`` has a policy only on pool ``a100s``, backed by two nodes of one GPU each:
``box-a`` (``gpu-class=a100``) and ``box-h`` (``gpu-class=h100``). ``orchestrator:two`` has a
policy without a reserved share on both pools.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from zenml_e2e.harness import Servers, running, zenml_available

pytestmark = [pytest.mark.zenml, pytest.mark.timeout(1800)]

_why = zenml_available()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)


@pytest.fixture(scope="module")
def zen(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with running(module_db_url, tmp_path_factory.mktemp("zenml")) as servers:
        servers.rp("POST", "/v1/pools", json={"name": "gpus", "capacity": {"gpu": 1}})
        servers.rp(
            "POST",
            "/v1/policies",
            json={"subject": "orchestrator:default", "pool": "gpus", "reserved": {"gpu": 1}},
        )
        servers.rp("POST", "/v1/policies", json={"subject": "orchestrator:iso", "pool": "gpus"})
        servers.rp("POST", "/v1/pools", json={"name": "a100s", "capacity": {}})
        for name, cls, device in (("box-a", "a100", "GPU-a"), ("box-h", "h100", "GPU-h")):
            node = {"name": name, "pool": "a100s", "labels": {"gpu-class": cls},
                    "capacity": {"gpu": 1}, "devices": {"gpu": [device]}}  # fmt: skip
            servers.rp("POST", "/v1/nodes", json=node)
        servers.rp(
            "POST",
            "/v1/policies",
            json={"subject": "orchestrator:nodes", "pool": "a100s", "reserved": {"gpu": 2}},
        )
        for pool in ("gpus", "a100s"):
            servers.rp("POST", "/v1/policies", json={"subject": "orchestrator:two", "pool": pool})
        yield servers


def _spans(steps: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    start = {s["tag"]: s["at"] for s in steps if s["event"] == "start"}
    end = {s["tag"]: s["at"] for s in steps if s["event"] == "end"}
    return {tag: (start[tag], end[tag]) for tag in start}


def test_two_competing_steps_serialize(zen: Servers) -> None:
    result = zen.drive("run", "pair", "default", "1", "2")
    assert result["status"] == "completed", result["output"][-3000:]
    spans = _spans(result["step_log"])
    (a0, a1), (b0, b1) = sorted(spans.values())
    assert a1 <= b0, f"the steps overlapped: {spans}"  # one GPU: the second waited
    reqs = zen.requests_of_run(result["run"])
    assert sorted(r["status"] for r in reqs) == ["released", "released"]
    assert {r["subject"] for r in reqs} == {"orchestrator:default"}
    assert all(
        r["labels"]["project"] == "default" and r["labels"]["user"] == "default" for r in reqs
    )
    first, second = sorted(reqs, key=lambda r: r["allocated_at"])
    assert second["allocated_at"] >= first["finished_at"]
    history = zen.rp("GET", f"/v1/requests/{second['id']}/events")
    assert [e["to"] for e in history] == ["queued", "allocated", "released"]


def test_step_asking_for_more_than_the_pool_fails_with_respools_reason(zen: Servers) -> None:
    result = zen.drive("run", "one", "default", "2", "0")
    assert result["status"] == "failed"
    assert "exceeds_capacity" in result["output"], result["output"][-3000:]
    assert result["step_log"] == []  # the step body never ran
    (req,) = zen.requests_of_run(result["run"])
    assert (req["status"], req["reason"]) == ("rejected", "exceeds_capacity")


def test_resource_request_list_shows_respools_requests(zen: Servers) -> None:
    result = zen.drive("run", "one", "default", "1", "0")
    assert result["status"] == "completed"
    (req,) = zen.requests_of_run(result["run"])
    listed = json.loads(zen.zenml_cli("resource-request", "list", "--output", "json"))["items"]
    by_id = {item["id"]: item for item in listed}
    assert req["id"] in by_id
    assert by_id[req["id"]]["status"] == "released"
    assert by_id[req["id"]]["pool_name"] == "gpus"
    everything = {r["id"] for r in zen.rp("GET", "/v1/requests", params={"limit": 1000})["items"]}
    assert set(by_id) <= everything


def test_a_request_rejected_on_several_pools_is_listed_with_its_candidate_pools(
    zen: Servers,
) -> None:
    # An inline step is non-preemptible, and orchestrator:two reserves nothing on either pool.
    result = zen.drive("run", "one", "two", "1", "0")
    assert result["status"] == "failed"
    assert "exceeds_reserved" in result["output"], result["output"][-3000:]
    (req,) = zen.requests_of_run(result["run"])
    assert (req["status"], req["reason"], req["pool"]) == ("rejected", "exceeds_reserved", None)
    listed = json.loads(zen.zenml_cli("resource-request", "list", "--output", "json"))["items"]
    (item,) = [item for item in listed if item["id"] == req["id"]]
    assert item["pool_name"] == "a100s, gpus"  # in the order respool tried them
    assert item["status"] == "rejected"


def test_step_of_a_subject_without_policy_runs_unmanaged(zen: Servers) -> None:
    result = zen.drive("run", "one", "free", "1", "0")
    assert result["status"] == "completed", result["output"][-3000:]
    assert [s["event"] for s in result["step_log"]] == ["start", "end"]
    (req,) = zen.requests_of_run(result["run"])
    assert (req["subject"], req["status"], req["reason"]) == (
        "orchestrator:free",
        "rejected",
        "no_policy",
    )


def test_preempted_isolated_step_is_interrupted_by_zenml(zen: Servers) -> None:
    proc = zen.start_drive("run", "one", "iso", "1", "600")
    try:
        deadline = time.monotonic() + 300
        while not Servers.steps(proc) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert Servers.steps(proc), "the isolated step never started"
        (held,) = zen.rp(
            "GET", "/v1/requests", params={"subject": "orchestrator:iso", "status": "allocated"}
        )["items"]
        assert held["preemptible"] and held["labels"]["zenml_reclaim_tolerance"] == "any"
        # The owner of the reserved share comes back: respool preempts the borrowed GPU.
        owner = zen.rp(
            "POST",
            "/v1/requests",
            params={"wait": 10},
            json={"subject": "orchestrator:default", "resources": {"gpu": 1}, "preemptible": False},
        )
        assert owner["status"] == "allocated"
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = zen.result(proc, out)
    assert result["steps"] == {"work": "cancelled"}, result["output"][-3000:]
    assert [s["event"] for s in result["step_log"]] == ["start"]  # interrupted, never ended
    gone = zen.rp("GET", f"/v1/requests/{held['id']}")
    assert (gone["status"], gone["reason"]) == ("preempted", "reclaim")
    zen.rp("POST", f"/v1/requests/{owner['id']}/release")


def test_gpu_class_steps_run_on_the_nodes_of_that_class(zen: Servers) -> None:
    # Two steps with ResourceSettings(gpu_count=1, gpu_class="a100"): one a100 GPU in the pool,
    # so they run one after the other on box-a, although box-h's GPU is free.
    result = zen.drive("run", "pair", "nodes", "1", "2", "a100")
    assert result["status"] == "completed", result["output"][-3000:]
    spans = _spans(result["step_log"])
    (a0, a1), (b0, b1) = sorted(spans.values())
    assert a1 <= b0, f"the steps overlapped: {spans}"
    reqs = zen.requests_of_run(result["run"])
    assert [r["node_selector"] for r in reqs] == [{"gpu-class": "a100"}] * 2
    assert [(r["pool"], r["status"]) for r in reqs] == [("a100s", "released")] * 2


def test_a_gpu_class_no_node_has_fails_the_step_with_no_fitting_node(zen: Servers) -> None:
    result = zen.drive("run", "one", "nodes", "1", "0", "v100")
    assert result["status"] == "failed"
    assert "no_fitting_node" in result["output"], result["output"][-3000:]
    assert result["step_log"] == []
    (req,) = zen.requests_of_run(result["run"])
    assert (req["status"], req["reason"]) == ("rejected", "no_fitting_node")
