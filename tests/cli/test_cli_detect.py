"""``respool node register --detect``: what a machine's nvidia-smi and OS say, with a fake
``nvidia-smi`` on PATH printing the shapes real ones print (an 8×A100 box, a MIG box, a failed
driver, no binary at all)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from respool_client.detect import detect, gpu_type
from respool_client.pairs import host_node_name

from support.cli import Cli, failed
from support.nvidia import fake_a100_box, fake_smi

MIG_QUERY = (
    "0, GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77, NVIDIA A100-SXM4-40GB, 40960 MiB\n"
    "1, GPU-6e6cb1e7-e44e-3c3d-635e-af4e9e3c9b88, NVIDIA A100-SXM4-40GB, 40960 MiB\n"
)
MIG_LIST = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 2g.10gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
  MIG 1g.5gb      Device  2: (UUID: MIG-1d4d0f3f-f4f4-5b5f-9c5e-6ef0e6ad3c4a)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-6e6cb1e7-e44e-3c3d-635e-af4e9e3c9b88)
"""
MIG_IDS = [
    "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f",
    "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb",
    "MIG-1d4d0f3f-f4f4-5b5f-9c5e-6ef0e6ad3c4a",
    "1",  # GPU 1 has no MIG instance: the whole GPU, by index
]

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure"
    " that the latest NVIDIA driver is installed and running.\n\n"
)


def _os_units() -> tuple[int, int]:
    """mcpu and memory_mb as a user would work them out on this machine."""
    cpus = len(os.sched_getaffinity(0))
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return cpus * 1000, kib * 1024 // 1_000_000


def test_the_node_name_of_a_host() -> None:
    """Lower case; other characters made '-'; no leading '.', '_' or '-'; 63 characters."""
    assert host_node_name("GPU-Box_07.Lab") == "gpu-box_07.lab"
    assert host_node_name("My Workstation (2)") == "my-workstation-2-"
    assert host_node_name("-x" + "a" * 80) == "x" + "a" * 62
    with pytest.raises(ValueError, match="no node name"):
        host_node_name("...")


def test_gpu_type_is_the_product_name_without_the_vendor() -> None:
    assert gpu_type("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert gpu_type("NVIDIA H100 80GB HBM3") == "H100-80GB-HBM3"
    assert gpu_type("Tesla V100-SXM2-16GB") == "V100-SXM2-16GB"
    assert gpu_type("NVIDIA GeForce RTX 4090") == "GeForce-RTX-4090"


def test_an_8_gpu_box(smi_dir: Path) -> None:
    fake_a100_box(smi_dir)
    found = detect()
    mcpu, memory_mb = _os_units()
    assert found.capacity == {"gpu": 8, "mcpu": mcpu, "memory_mb": memory_mb}
    # GPU indices: what CUDA_VISIBLE_DEVICES takes
    assert found.devices == {"gpu": [str(i) for i in range(8)]}
    assert found.labels == {"gpu-type": "A100-SXM4-80GB"}
    assert found.notes == []


def test_a_mig_box_lists_its_mig_devices(smi_dir: Path) -> None:
    fake_smi(smi_dir, MIG_QUERY, MIG_LIST)
    found = detect()
    assert found.devices == {"gpu": MIG_IDS} and found.capacity["gpu"] == 4
    assert found.labels == {"gpu-type": "A100-SXM4-40GB"}
    assert found.notes == ["3 MIG devices: their MIG UUIDs are the gpu device ids"]


def test_a_failed_driver_is_a_machine_without_gpu(smi_dir: Path) -> None:
    fake_smi(smi_dir, NO_DRIVER, NO_DRIVER, code=9)
    found = detect()
    assert "gpu" not in found.capacity and found.devices == {} and found.labels == {}
    assert found.capacity["mcpu"] == _os_units()[0]
    assert found.notes == [
        "nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA"
        " driver. Make sure that the latest NVIDIA driver is installed and running.; registering"
        " a machine with no GPU"
    ]


def test_no_nvidia_smi_is_a_machine_without_gpu(smi_dir: Path) -> None:
    found = detect()
    assert "gpu" not in found.capacity
    assert found.notes == ["no nvidia-smi on PATH: registering a machine with no GPU"]


async def test_register_detect_then_again_updates(cli: Cli, smi_dir: Path) -> None:
    await cli.ok("pool", "create", "boxes")
    fake_a100_box(smi_dir)
    result = await cli.ok("node", "register", "--pool", "boxes", "--detect", "-o", "json")
    name = host_node_name()
    assert f"registered node {name} in pool boxes" in result.stderr
    node = json.loads(result.stdout)
    mcpu, memory_mb = _os_units()
    assert node["name"] == name and node["pool"] == "boxes"
    assert node["capacity"] == {"gpu": 8, "mcpu": mcpu, "memory_mb": memory_mb}
    assert node["devices"] == {"gpu": [str(i) for i in range(8)]}
    assert node["labels"] == {"gpu-type": "A100-SXM4-80GB"}
    pool = (await cli.json("pool", "describe", "boxes"))["pool"]
    assert pool["capacity"]["gpu"] == 8 and pool["nodes"] == 1

    # the box comes back with MIG instances, and a label of the user's own stays
    await cli.ok("node", "label", name, "zone=eu-1")
    fake_smi(smi_dir, MIG_QUERY, MIG_LIST)
    again = await cli.ok("node", "register", "--detect", "-o", "json")
    assert f"updated node {name} in pool boxes" in again.stderr
    node = json.loads(again.stdout)
    assert node["devices"] == {"gpu": MIG_IDS} and node["capacity"]["gpu"] == 4
    assert node["labels"] == {"gpu-type": "A100-SXM4-40GB", "zone": "eu-1"}

    # the driver is gone: the machine has no GPU any more, and the command says why
    fake_smi(smi_dir, NO_DRIVER, NO_DRIVER, code=9)
    gone = await cli.ok("node", "register", "--detect", "-o", "json")
    assert "NVIDIA-SMI has failed" in gone.stderr and "no GPU" in gone.stderr
    node = json.loads(gone.stdout)
    assert "gpu" not in node["capacity"] and node["devices"] == {}
    assert node["labels"] == {"zone": "eu-1"}
    assert (await cli.json("pool", "describe", "boxes"))["pool"]["capacity"].get("gpu") is None


async def test_register_without_detect(cli: Cli, smi_dir: Path) -> None:
    node = await cli.json(
        "node", "register", "--name", "cpu-07", "-c", "{mcpu: 32000, memory_mb: 128000}"
    )
    assert (node["name"], node["pool"]) == ("cpu-07", None)
    assert node["capacity"] == {"mcpu": 32000, "memory_mb": 128000}
    err = failed(await cli.api("node", "register", "--name", "cpu-08"), code=2)
    assert "--capacity" in err and "--detect" in err
    bad = failed(await cli.api("node", "register", "--name", "Bad Name", "-c", "{mcpu: 1}"), 2)
    assert bad.startswith("--name")
    # no nvidia-smi and --detect: CPU and memory only, said in one line
    result = await cli.ok("node", "register", "--name", "cpu-09", "--detect", "-o", "json")
    assert "no nvidia-smi on PATH" in result.stderr
