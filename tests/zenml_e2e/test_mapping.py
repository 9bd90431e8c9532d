"""The ZenML → respool mapping of respool_zenml.mapping (pure: runs without ZenML installed)."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integrations" / "zenml"))

import respool_zenml.mapping as zm  # type: ignore[import-not-found]  # noqa: E402  (sys.path above)


@dataclass
class D:
    """The fields of ZenML's ResourceRequestDemand that the mapping reads."""

    quantity: int
    resource: str | None = None
    kind: str | None = None
    unit: str | None = None
    class_name: str | None = None
    resource_selector: dict[str, Any] | None = None
    class_selector: dict[str, Any] | None = None


def test_settings_demands_become_respool_keys() -> None:
    # What ZenML makes of ResourceSettings(gpu_count=2, cpu_count=1.5, memory="8GB",
    # resources={"licence_x": 1}): one demand per field.
    demands = [
        D(1, resource="licence_x"),
        D(2, kind="gpu"),
        D(1500, kind="cpu", unit="mCPU"),
        D(8, kind="memory", unit="GB"),
    ]
    assert zm.demands_to_resources(demands) == {
        "licence_x": 1,
        "gpu": 2,
        "mcpu": 1500,
        "memory_mb": 8000,
    }


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        (D(4, kind="cpu", unit="CPU"), ("mcpu", 4000)),
        (D(1, kind="memory", unit="GiB"), ("memory_mb", 1074)),
        (D(16, kind="memory", unit="GiB"), ("memory_mb", 17180)),
        (D(1500, kind="memory", unit="KB"), ("memory_mb", 2)),
        (D(2, kind="gpu", class_name="A100-80GB"), ("gpu", 2)),  # the class selects the node
        (D(3, kind="tpu"), ("tpu", 3)),
    ],
)
def test_units_and_classes(demand: D, expected: tuple[str, int]) -> None:
    assert zm.demands_to_resources([demand]) == dict([expected])


def test_same_key_adds_up() -> None:
    assert zm.demands_to_resources([D(1, kind="gpu"), D(2, resource="gpu")]) == {"gpu": 3}


@pytest.mark.parametrize(
    "demand",
    [
        D(1, resource="Bad-Name"),
        D(1, resource_selector={"gpu-type": "A100-80G"}),  # a selector names no key
        D(1, kind="cpu", unit="cores"),
        D(1, kind="memory", unit="GB2"),
        D(1, resource="step_run"),
        D(1),
    ],
)
def test_what_respool_cannot_express_is_refused_clearly(demand: D) -> None:
    with pytest.raises(zm.UnsupportedDemand) as info:
        zm.demands_to_resources([demand])
    assert str(info.value)


def test_gpu_class_selects_the_gpu_class_label() -> None:
    # ResourceSettings(gpu_count=2, gpu_class="a100"): ZenML's demand kind=gpu, class a100.
    demands = [D(2, kind="gpu", class_name="a100"), D(8, kind="memory", unit="GB")]
    assert zm.demands_to_resources(demands) == {"gpu": 2, "memory_mb": 8000}
    assert zm.demands_to_node_selector(demands) == {"gpu-class": "a100"}


def test_flat_selectors_become_node_labels() -> None:
    demands = [
        D(4, kind="gpu", class_selector={"gpu-type": "A100-80G", "nvlink": True}),
        D(1, resource="licence_x", resource_selector={"zone": "b", "rack": 7}),
        D(2, kind="cpu", class_selector={"gpu-type": "A100-80G"}),  # the same pair again
    ]
    assert zm.demands_to_resources(demands) == {"gpu": 4, "licence_x": 1, "mcpu": 2000}
    assert zm.demands_to_node_selector(demands) == {
        "gpu-type": "A100-80G",
        "nvlink": "true",
        "zone": "b",
        "rack": "7",
    }
    assert zm.demands_to_node_selector([D(1, kind="gpu")]) == {}


@pytest.mark.parametrize(
    ("demands", "message"),
    [
        ([D(1, kind="gpu", class_selector={"gpu-type": ["A100", "H100"]})], "equality"),
        ([D(1, kind="gpu", class_selector={"memory": {"gte": 80}})], "equality"),
        ([D(1, kind="gpu", class_selector={"memory": 80.5})], "equality"),
        ([D(1, kind="gpu", resource_selector={"zone": None})], "equality"),
        ([D(1, kind="gpu", class_selector={"GPU Type": "a100"})], "node label name"),
        ([D(1, kind="gpu", class_selector={"gpu-type": "x" * 64})], "63"),
        (
            [D(1, kind="gpu", class_name="a100", class_selector={"gpu-class": "h100"})],
            "contradicts",
        ),
        (
            [D(1, kind="gpu", class_name="a100"), D(1, kind="gpu", class_name="h100")],
            "one node",
        ),
    ],
)
def test_selectors_respool_cannot_express_are_refused_clearly(
    demands: list[D], message: str
) -> None:
    with pytest.raises(zm.UnsupportedDemand, match=message):
        zm.demands_to_node_selector(demands)


def test_the_steps_of_one_run_share_its_preemption_group() -> None:
    run, other = uuid.uuid4(), uuid.uuid4()
    # The group is the pipeline run's id: both steps of one run carry it, another run differs.
    assert zm.preemption_group_for(run) == str(run) == zm.preemption_group_for(str(run))
    assert zm.preemption_group_for(other) != zm.preemption_group_for(run)
    assert zm.preemption_group_for(None) is None  # a step of no known run: no group
    with pytest.raises(zm.UnsupportedDemand, match="preemption group"):
        zm.preemption_group_for("x" * 129)


def test_subject_is_type_and_name() -> None:
    assert zm.subject_for("orchestrator", "prod-stack") == "orchestrator:prod-stack"
    assert zm.subject_for("step_operator", "gpu_box") == "step_operator:gpu_box"
    with pytest.raises(zm.UnsupportedDemand, match="rename the component"):
        zm.subject_for("orchestrator", "my stack")


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        ("queued", None, "pending"),
        ("allocated", None, "allocated"),
        ("rejected", "no_policy", "no_matching_pool"),
        ("rejected", "exceeds_capacity", "rejected"),
        ("preempting", "reclaim", "preempting"),
        ("preempted", "priority", "preempted"),
        ("cancelled", "abandoned", "cancelled"),
        ("expired", "lease_expired", "expired"),
        ("released", None, "released"),
    ],
)
def test_statuses(status: str, reason: str | None, expected: str) -> None:
    assert zm.zenml_status(status, reason) == expected


def test_status_reason_carries_respools_reason_and_message() -> None:
    assert (
        zm.status_reason("rejected", "exceeds_capacity", "gpu: needs 2, pool gpus has 1")
        == "exceeds_capacity: gpu: needs 2, pool gpus has 1"
    )
    assert zm.status_reason("queued", None, "waiting for gpu") == "waiting for gpu"
    assert zm.status_reason("released", None, "") is None


def _policy(subject: str, pool: str, priority: int = 0) -> dict[str, Any]:
    return {"subject": subject, "pool": pool, "priority": priority}


def test_candidate_pools_are_the_subjects_pools_in_the_order_respool_tries_them() -> None:
    # What `zenml resource-request list` shows as the pool of a request rejected on several.
    policies = [
        _policy("orchestrator:default", "gpus"),
        _policy("orchestrator:default", "a100s"),
        _policy("orchestrator:other", "spare"),
        _policy("orchestrator:*", "shared", priority=5),  # a pattern policy covers it too
        _policy("step_operator:*", "elsewhere", priority=9),
    ]
    assert zm.candidate_pools("orchestrator:default", policies) == ["shared", "a100s", "gpus"]
    assert zm.candidate_pools("orchestrator:other", policies) == ["shared", "spare"]
    assert zm.candidate_pools("orchestrator:nobody-else", policies) == ["shared"]
    assert zm.candidate_pools("experiment_tracker:x", policies) == []


def test_on_one_pool_the_subjects_own_policy_wins_over_a_pattern() -> None:
    policies = [
        _policy("orchestrator:*", "gpus", priority=9),
        _policy("orchestrator:prod*", "gpus", priority=4),
        _policy("orchestrator:prod", "gpus", priority=0),
        _policy("orchestrator:prod*", "cpus", priority=3),
        _policy("orchestrator:*", "cpus", priority=0),
        _policy("orchestrator:*", "big", priority=2),
    ]
    # gpus: the exact policy (priority 0), else prod* (4); cpus: prod*, the longer prefix (3).
    assert zm.candidate_pools("orchestrator:prod", policies) == ["cpus", "big", "gpus"]
    assert zm.candidate_pools("orchestrator:prod-2", policies) == ["gpus", "cpus", "big"]


def test_a_slice_of_a_shared_gpu_is_named_resources() -> None:
    # ResourceSettings(resources={"gpu_memory_mb": 20480, "gpu_share": 50}) (docs/zenml.md,
    # "A slice of a shared GPU"): the keys pass through as they are.
    demands = [D(20480, resource="gpu_memory_mb"), D(50, resource="gpu_share")]
    assert zm.demands_to_resources(demands) == {"gpu_memory_mb": 20480, "gpu_share": 50}
