"""A fake ``nvidia-smi`` on PATH printing what a real one prints on an 8×A100 box (or whatever a
test gives it): ``respool node register --detect`` and ``respool agent --register --detect``
read it as they read a real one, and ``respool run`` measures its command's GPU memory through
``--query-compute-apps`` (:func:`compute_apps`: the processes and the MiB each uses, which a
test, or the command itself, writes while it runs).

The boxes: :data:`A100_QUERY` / :data:`A100_LIST` (8 × A100 80 GB), :data:`H100_MIG_QUERY` /
:data:`H100_MIG_LIST` (two H100 80 GB, the first split in MIG instances)."""

from __future__ import annotations

import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "A100_LIST",
    "A100_QUERY",
    "A100_UUIDS",
    "H100_MIG_IDS",
    "H100_MIG_LIST",
    "H100_MIG_QUERY",
    "apps_file",
    "compute_apps",
    "fake_a100_box",
    "fake_h100_mig_box",
    "fake_smi",
    "gpus",
]

A100_UUIDS = [f"GPU-{i}a1b2c3d-0000-1111-2222-33334444555{i}" for i in range(8)]
A100_QUERY = "".join(
    f"{i}, {u}, NVIDIA A100-SXM4-80GB, 81920 MiB\n" for i, u in enumerate(A100_UUIDS)
)
A100_LIST = "".join(
    f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: {u})\n" for i, u in enumerate(A100_UUIDS)
)

# An H100 box: GPU 0 split in MIG instances (two 3g.40gb, one 1g.10gb), GPU 1 whole.
H100_MIG_QUERY = (
    "0, GPU-0b9e2a61-7c3d-4e5f-8a9b-0c1d2e3f4a5b, NVIDIA H100 80GB HBM3, 81559 MiB\n"
    "1, GPU-1c8f3b72-8d4e-5f6a-9b0c-1d2e3f4a5b6c, NVIDIA H100 80GB HBM3, 81559 MiB\n"
)
H100_MIG_IDS = {
    "mig_3g_40gb": [
        "MIG-2a7e4c83-9e5f-5a6b-8c7d-2e3f4a5b6c7d",
        "MIG-3b6d5d94-af60-5b7c-9d8e-3f4a5b6c7d8e",
    ],
    "mig_1g_10gb": ["MIG-4c5c6ea5-b071-5c8d-ae9f-4a5b6c7d8e9f"],
}
H100_MIG_LIST = (
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0b9e2a61-7c3d-4e5f-8a9b-0c1d2e3f4a5b)\n"
    f"  MIG 3g.40gb     Device  0: (UUID: {H100_MIG_IDS['mig_3g_40gb'][0]})\n"
    f"  MIG 3g.40gb     Device  1: (UUID: {H100_MIG_IDS['mig_3g_40gb'][1]})\n"
    f"  MIG 1g.10gb     Device  2: (UUID: {H100_MIG_IDS['mig_1g_10gb'][0]})\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1c8f3b72-8d4e-5f6a-9b0c-1d2e3f4a5b6c)\n"
)


def gpus(n: int) -> tuple[str, str]:
    """(query, listing) of a box with the first ``n`` of those A100s."""
    return "".join(A100_QUERY.splitlines(True)[:n]), "".join(A100_LIST.splitlines(True)[:n])


def apps_file(bin_dir: Path) -> Path:
    """The file the fake prints for ``--query-compute-apps``: lines ``pid, used_memory`` (MiB,
    as ``--format=csv,noheader,nounits`` prints them). A command can append its own line to it
    (``echo "$$, 30000" >> FILE``) so that the fake reports a process of its group."""
    return bin_dir / "apps.txt"


def compute_apps(bin_dir: Path, apps: Iterable[tuple[int, int]]) -> None:
    """What the fake reports as the compute processes: (pid, MiB used) each."""
    apps_file(bin_dir).write_text("".join(f"{pid}, {mib}\n" for pid, mib in apps))


def fake_smi(bin_dir: Path, query: str, listing: str, code: int = 0) -> None:
    """An executable ``bin_dir/nvidia-smi`` that prints ``listing`` for ``-L``, the compute
    processes (:func:`compute_apps`, none at first) for ``--query-compute-apps=...``, else
    ``query``, and exits with ``code``."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "query.txt").write_text(query)
    (bin_dir / "list.txt").write_text(listing)
    apps = apps_file(bin_dir)
    if not apps.exists():
        apps.write_text("")
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  -L) cat "{bin_dir}/list.txt" ;;\n'
        f'  --query-compute-apps=*) cat "{apps}" ;;\n'
        f'  *) cat "{bin_dir}/query.txt" ;;\n'
        "esac\n"
        f"exit {code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def fake_a100_box(bin_dir: Path) -> None:
    """:func:`fake_smi` of a box of 8 A100 80GB GPUs (:data:`A100_QUERY`, :data:`A100_LIST`)."""
    fake_smi(bin_dir, A100_QUERY, A100_LIST)


def fake_h100_mig_box(bin_dir: Path) -> None:
    """:func:`fake_smi` of an H100 box split in part in MIG instances (:data:`H100_MIG_QUERY`,
    :data:`H100_MIG_LIST`)."""
    fake_smi(bin_dir, H100_MIG_QUERY, H100_MIG_LIST)
