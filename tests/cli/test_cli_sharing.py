"""Shared GPUs on the command line (docs/cli.md; docs/placement.md, "Sharing a GPU"): what
``--detect`` finds for a shared key (the device memory from ``memory.total``; MIG instances
whole devices of their own key), the node body the options make, the request's
``--gpu-memory`` / ``--gpu-share`` and their one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from respool_client.detect import detect, registration
from respool_client.pairs import mebibytes, percent

from support.cli import Cli, failed
from support.nvidia import (
    H100_MIG_IDS,
    H100_MIG_LIST,
    H100_MIG_QUERY,
    fake_a100_box,
    fake_h100_mig_box,
    fake_smi,
)

# No server: every command here fails on its options before it calls one.
NOWHERE = Cli(url="http://127.0.0.1:9", db_url="")


def test_sizes_of_device_memory() -> None:
    assert mebibytes("20GiB") == mebibytes("20Gi") == mebibytes("20480") == 20480
    assert mebibytes("512MiB") == 512 and mebibytes("1.5GiB") == 1536
    assert mebibytes("0", minimum=0) == 0
    for bad in ("20GB", "20G", "1.5", "0.0001GiB", "-1", "", "lots", "0"):
        with pytest.raises(ValueError):
            mebibytes(bad)
    assert percent("50") == percent("50%") == 50
    for bad in ("0", "101", "12.5", "x"):
        with pytest.raises(ValueError):
            percent(bad)


def test_a_shared_8_gpu_box_offers_each_gpus_memory(smi_dir: Path) -> None:
    fake_a100_box(smi_dir)
    found = detect(sharing={"gpu": "mps"})
    assert found.devices == {"gpu": [str(i) for i in range(8)]}
    assert found.sharing == {"gpu": "mps"}
    assert found.device_memory_mb == {"gpu": 81920}  # memory.total, MiB


def test_without_sharing_detect_finds_no_device_memory(smi_dir: Path) -> None:
    fake_a100_box(smi_dir)
    found = detect()
    assert (found.sharing, found.device_memory_mb) == ({}, {})


def test_mig_instances_stay_whole_devices_of_their_own_key(smi_dir: Path) -> None:
    fake_h100_mig_box(smi_dir)
    found = detect(sharing={"gpu": "time-slicing"})
    assert found.devices == {"gpu": ["1"], **H100_MIG_IDS}  # only GPU 1 is whole: shared
    assert {k: found.capacity[k] for k in found.devices} == {
        "gpu": 1,
        "mig_3g_40gb": 2,
        "mig_1g_10gb": 1,
    }
    assert found.sharing == {"gpu": "time-slicing"}
    assert found.device_memory_mb == {"gpu": 81559}
    assert any("mig_1g_10gb" in note and "whole" in note for note in found.notes)


def test_a_box_all_in_mig_has_no_gpu_to_share(smi_dir: Path) -> None:
    query = H100_MIG_QUERY.splitlines(True)[0]
    listing = "".join(H100_MIG_LIST.splitlines(True)[:4])
    fake_smi(smi_dir, query, listing)
    found = detect(sharing={"gpu": "mps"})
    assert "gpu" not in found.devices and found.sharing == {}
    assert found.devices == H100_MIG_IDS
    assert any("no gpu to share" in note for note in found.notes)


def test_the_registration_carries_the_sharing_fields_only_when_given() -> None:
    _, _, plain = registration(
        None, "n1", pool="p", capacity={}, devices={"gpu": ["0"]}, labels={}, detected=True
    )
    assert not {"sharing", "device_memory_mb", "reserved_memory_mb"} & plain.keys()
    method, _, body = registration(
        None,
        "n1",
        pool="p",
        capacity={},
        devices={"gpu": ["0"]},
        labels={},
        detected=True,
        sharing={"gpu": "mps"},
        device_memory_mb={"gpu": 81920},
        reserved_memory_mb={"gpu": 512},
    )
    assert method == "POST"
    assert (body["sharing"], body["device_memory_mb"], body["reserved_memory_mb"]) == (
        {"gpu": "mps"},
        {"gpu": 81920},
        {"gpu": 512},
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--gpu-memory", "20GB"), "--gpu-memory"),
        (("--gpu-memory", "lots"), "--gpu-memory"),
        (("--gpu-memory", "1GiB", "--gpu-share", "101"), "--gpu-share"),
        (("--gpu-share", "50"), "--gpu-share"),  # a share is of a slice
        (("--gpu", "1", "--gpu-memory", "1GiB"), "--gpu-memory"),  # whole or a slice
        (("--gpu-memory", "2GiB", "-r", "gpu_memory_mb=1024"), "--gpu-memory"),
    ],
)
async def test_request_slice_options_refused_in_one_line(args: tuple[str, ...], named: str) -> None:
    err = failed(await NOWHERE.api("request", "create", "-s", "a:b", *args), code=2)
    assert named in err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--sharing", "gpu=magic"), "--sharing"),
        (("--sharing", "gpu"), "--sharing"),
        (("--device-memory", "gpu=80GB"), "--device-memory"),
        (("--reserved-memory", "gpu=-1"), "--reserved-memory"),
    ],
)
async def test_node_sharing_options_refused_in_one_line(args: tuple[str, ...], named: str) -> None:
    err = failed(await NOWHERE.api("node", "add", "n1", "--devices", "gpu=0", *args), code=2)
    assert named in err
