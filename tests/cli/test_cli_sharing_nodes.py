"""Shared GPUs of a node through the command line and the server (docs/cli.md, "Shared GPUs";
docs/placement.md, "Sharing a GPU"): ``node add --sharing/--device-memory/--reserved-memory``
and ``node register --detect --sharing`` send the node's ``sharing``, ``device_memory_mb`` and
``reserved_memory_mb``, which the node's answer carries; a slice asked with ``--gpu-memory``
lands on one device of it, and ``respool run`` gives its command that one device and the
slice's variables."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from respool_client.pairs import host_node_name

from support.cli import Cli
from support.nvidia import (
    H100_MIG_IDS,
    fake_a100_box,
    fake_h100_mig_box,
)


async def test_node_add_with_sharing(cli: Cli) -> None:
    await cli.ok("pool", "create", "nb")
    node = await cli.json(
        "node", "add", "nb-01", "--pool", "nb", "--devices", "gpu=0,1",
        "--sharing", "gpu=mps", "--device-memory", "gpu=80GiB", "--reserved-memory", "gpu=512",
    )  # fmt: skip
    assert node["sharing"] == {"gpu": "mps"}
    assert node["device_memory_mb"] == {"gpu": 81920}
    assert node["reserved_memory_mb"] == {"gpu": 512}


async def test_register_detect_sharing(cli: Cli, smi_dir: Path) -> None:
    await cli.ok("pool", "create", "nb")
    fake_a100_box(smi_dir)
    node = await cli.json("node", "register", "--pool", "nb", "--detect", "--sharing", "gpu=mps")
    assert node["name"] == host_node_name()
    assert node["sharing"] == {"gpu": "mps"} and node["device_memory_mb"] == {"gpu": 81920}
    # the box comes back split in MIG: its instances are whole devices of their own keys
    fake_h100_mig_box(smi_dir)
    again = await cli.json("node", "register", "--detect", "--sharing", "gpu=time-slicing")
    assert again["devices"] == {"gpu": ["1"], **H100_MIG_IDS}
    assert again["sharing"] == {"gpu": "time-slicing"}
    assert again["device_memory_mb"] == {"gpu": 81559}


async def test_two_respool_runs_share_one_device_each_with_its_slice(
    cli: Cli, tmp_path: Path
) -> None:
    await cli.ok("pool", "create", "nb")
    await cli.ok("pool", "attach-policy", "nb", "team:nb")
    await cli.ok(
        "node", "add", "nb-01", "--pool", "nb", "--devices", "gpu=0,1",
        "--sharing", "gpu=mps", "--device-memory", "gpu=81920",
    )  # fmt: skip
    # Each command writes its environment, then waits for the other's: both hold at once.
    probe = (
        "import json, os, sys, time; json.dump({k: v for k, v in os.environ.items()"
        " if k.startswith(('RESPOOL_GPU', 'CUDA_'))}, open(sys.argv[1], 'w'));"
        " deadline = time.monotonic() + 30\n"
        "while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline: time.sleep(0.05)\n"
        "sys.exit(0 if os.path.exists(sys.argv[2]) else 3)"
    )
    env = {**os.environ, "RESPOOL_URL": cli.url, "RESPOOL_SUBJECT": "team:nb"}
    env.pop("RESPOOL_TOKEN", None)
    one, two = tmp_path / "one.json", tmp_path / "two.json"

    def run(slice_options: list[str], mine: Path, other: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "respool_client.run", "--pool", "nb", *slice_options,
             "--", sys.executable, "-c", probe, str(mine), str(other)],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    first, second = await asyncio.gather(
        asyncio.to_thread(run, ["--gpu-memory", "20GiB"], one, two),
        asyncio.to_thread(run, ["--gpu-memory", "40GiB", "--gpu-share", "50"], two, one),
    )
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    seen_one, seen_two = json.loads(one.read_text()), json.loads(two.read_text())
    # pack: the second slice goes on the device the first one already uses
    assert seen_one["CUDA_VISIBLE_DEVICES"] == seen_two["CUDA_VISIBLE_DEVICES"]
    assert seen_one["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    assert seen_one["RESPOOL_GPU_MEMORY_MB"] == "20480"
    assert seen_one["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert "RESPOOL_GPU_SHARE" not in seen_one
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in seen_one
    assert seen_two["RESPOOL_GPU_MEMORY_MB"] == "40960" and seen_two["RESPOOL_GPU_SHARE"] == "50"
    assert seen_two["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert seen_two["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert seen_one["RESPOOL_GPU_ISOLATION"] == seen_two["RESPOOL_GPU_ISOLATION"] == "mps"
    assert "a slice of 20480 MiB (mps: memory limited" in first.stderr
    assert "a slice of 40960 MiB, 50% of its compute (mps: memory and compute" in second.stderr


async def test_node_describe_shows_each_slice_and_the_free_memory(cli: Cli) -> None:
    await cli.ok("pool", "create", "nb")
    await cli.ok("pool", "attach-policy", "nb", "team:*")
    await cli.ok(
        "node", "add", "nb-01", "--pool", "nb", "--devices", "gpu=0,1,2",
        "--sharing", "gpu=mps", "--device-memory", "gpu=81920", "--reserved-memory", "gpu=512",
    )  # fmt: skip
    # pack: both slices land on the same device, the whole one on another
    a = await cli.json(
        "request",
        "create",
        "-s",
        "team:a",
        "--pool",
        "nb",
        "--gpu-memory",
        "20GiB",
        "--gpu-share",
        "50",
    )
    b = await cli.json("request", "create", "-s", "team:b", "--pool", "nb", "--gpu-memory", "10GiB")
    w = await cli.json("request", "create", "-s", "team:w", "--pool", "nb", "-r", "gpu=1")
    sliced = a["placement"]["devices"]["gpu"][0]
    assert b["placement"]["devices"]["gpu"] == [sliced]
    whole = w["placement"]["devices"]["gpu"][0]
    result = await cli.api("node", "describe", "nb-01", COLUMNS="200")
    assert result.exit_code == 0, result.output
    out = result.stdout
    devices = out[out.index("Devices") : out.index("Allocations")].splitlines()[3:]
    rows = [line.split() for line in devices if line.strip()]
    offer = "81408"  # 81920 - 512 reserved
    free = f"{81408 - 20480 - 10240}/{offer}"
    assert rows[0][:2] == ["gpu", sliced] and rows[0][-3:] == [free, "MiB", "(mps)"]
    slice_rows = [" ".join(r) for r in rows[:2]]
    assert any(f"{a['id'][:8]} team:a 20480 MiB, 50%" in r for r in slice_rows)
    assert any(f"{b['id'][:8]} team:b 10240 MiB" in r for r in slice_rows)
    assert ["gpu", whole, w["id"][:8], "team:w", "whole", f"0/{offer}", "MiB", "(mps)"] in rows
    spare = next(d for d in ("0", "1", "2") if d not in (sliced, whole))
    assert ["gpu", spare, "-", "-", "-", f"{offer}/{offer}", "MiB", "(mps)"] in rows
    # in a terminal of 80 columns every line fits, and each holder is still named
    narrow = await cli.api("node", "describe", "nb-01", COLUMNS="80")
    assert narrow.exit_code == 0, narrow.output
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80, narrow.stdout
    for held in (a, b, w):
        assert held["id"][:8] in narrow.stdout
    # the derived keys count the memory and share, and say where they come from
    capacity = {line.split()[0]: line.split() for line in out.splitlines() if "gpu_" in line}
    assert capacity["gpu_memory_mb"][1:3] == [str(3 * 81408), str(20480 + 10240 + 81408)]
    assert capacity["gpu_share"][1:3] == ["300", "150"]
    # the pool counts the shared memory as a key of its own: USED/TOTAL in list and describe
    used = f"{20480 + 10240 + 81408}/{3 * 81408}"
    for view in (("pool", "list"), ("pool", "describe", "nb")):
        shown = await cli.api(*view, COLUMNS="200")
        assert shown.exit_code == 0, shown.output
        line = next(x for x in shown.stdout.splitlines() if "gpu_memory_mb" in x)
        assert used in line
