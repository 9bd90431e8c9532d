"""The step's environment of a slice of a shared GPU (docs/placement.md, "Sharing a GPU", "On
the step side"), from a wire Request as the server answers it: the one device in
``CUDA_VISIBLE_DEVICES``, ``RESPOOL_GPU_MEMORY_MB``, ``RESPOOL_GPU_SHARE`` when a share was
asked; under ``mps`` also the MPS limits; under ``time-slicing`` no driver limit; whole devices
as before (exclusive)."""

from __future__ import annotations

from typing import Any

from respool_client import Grant, Request
from respool_client.grant import describe_slices

from support.wire import wire_request

MPS_VARS = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


def _request(placement: dict[str, Any], resources: dict[str, int]) -> Request:
    return wire_request(
        subject="team:notebooks", resources=resources, version=2, placement=placement
    )


def _slice(mode: str, share: int | None) -> dict[str, Any]:
    part: dict[str, Any] = {"memory_mb": 20480} | ({} if share is None else {"share": share})
    return {
        "node": "n1",
        "labels": {},
        "devices": {"gpu": ["3"]},
        "slices": {"gpu": {"3": part}},
        "isolation": {"gpu": mode},
    }


def test_an_mps_slice_with_a_share_sets_the_mps_limits_on_device_0() -> None:
    env = Grant(_request(_slice("mps", 50), {"gpu_memory_mb": 20480, "gpu_share": 50})).env()
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # that one device
    assert env["RESPOOL_GPU_MEMORY_MB"] == "20480"
    assert env["RESPOOL_GPU_SHARE"] == "50"
    # Inside the step its one visible device is device 0.
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["RESPOOL_GPU_ISOLATION"] == "mps"


def test_an_mps_slice_without_a_share_promises_no_compute() -> None:
    env = Grant(_request(_slice("mps", None), {"gpu_memory_mb": 20480})).env()
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert "RESPOOL_GPU_SHARE" not in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    (line,) = describe_slices(
        Grant(_request(_slice("mps", None), {"gpu_memory_mb": 20480})).placement
    )  # type: ignore[arg-type]
    assert line == "gpu 3: a slice of 20480 MiB (mps: memory limited by the MPS server)"


def test_a_time_sliced_slice_sets_no_driver_limit_and_says_so() -> None:
    state = _request(_slice("time-slicing", 25), {"gpu_memory_mb": 20480, "gpu_share": 25})
    env = Grant(state).env()
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert (env["RESPOOL_GPU_MEMORY_MB"], env["RESPOOL_GPU_SHARE"]) == ("20480", "25")
    assert env["RESPOOL_GPU_ISOLATION"] == "time-slicing"
    assert not any(name in env for name in MPS_VARS)
    assert state.placement is not None
    (line,) = describe_slices(state.placement)
    assert "gpu 3" in line and "20480 MiB" in line and "not enforced" in line


def test_whole_devices_are_exclusive_and_carry_no_slice_variables() -> None:
    placement = {
        "node": "n1",
        "labels": {},
        "devices": {"gpu": ["0", "1"]},
        "slices": {},
        "isolation": {"gpu": "exclusive"},
    }
    env = Grant(_request(placement, {"gpu": 2})).env()
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["RESPOOL_GPU_ISOLATION"] == "exclusive"
    for name in ("RESPOOL_GPU_MEMORY_MB", "RESPOOL_GPU_SHARE", *MPS_VARS):
        assert name not in env
    assert describe_slices(Grant(_request(placement, {"gpu": 2})).placement) == []  # type: ignore[arg-type]


def test_a_placement_of_an_older_server_has_no_slices() -> None:
    placement = {"node": "n1", "labels": {}, "devices": {"gpu": ["2"]}}
    grant = Grant(_request(placement, {"gpu": 1}))
    assert grant.placement is not None
    assert (grant.placement.slices, grant.placement.isolation) == ({}, {})
    assert grant.env()["CUDA_VISIBLE_DEVICES"] == "2"
    assert "RESPOOL_GPU_ISOLATION" not in grant.env()


def test_a_slice_of_another_device_key_gets_its_own_names() -> None:
    placement = {
        "node": "n1",
        "labels": {},
        "devices": {"npu": ["a"]},
        "slices": {"npu": {"a": {"memory_mb": 4096}}},
        "isolation": {"npu": "time-slicing"},
    }
    env = Grant(_request(placement, {"npu_memory_mb": 4096})).env()
    assert env["RESPOOL_NPU_MEMORY_MB"] == "4096"
    assert env["RESPOOL_NPU_ISOLATION"] == "time-slicing"
    assert "CUDA_VISIBLE_DEVICES" not in env and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
