"""How ``respool run`` measures a command's GPU memory (respool_client.usage; docs/placement.md,
"On the step side"): the rows of ``nvidia-smi --query-compute-apps``, summed over the processes
of the command's process group and their descendants, never over another group's; nothing
without a working nvidia-smi. Real processes, the fake nvidia-smi of tests/support."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from respool_client.usage import gpu_memory_of_group, measure, parse_compute_apps

from support.nvidia import compute_apps, fake_a100_box, fake_smi


def test_the_rows_nvidia_smi_prints() -> None:
    text = "4242, 18000\n4243, [N/A]\n\n 77 , 512 \nNo running processes found\n"
    assert parse_compute_apps(text) == [(4242, 18000), (77, 512)]


@pytest.fixture
def group() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A process group of its own: a leader ``sh`` and its ``sleep`` child (pid given); ended
    after the test."""
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    try:
        yield leader, child
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()
        leader.stdout.close()


def test_the_group_and_its_descendants_count_others_do_not(
    group: tuple[subprocess.Popen[bytes], int],
) -> None:
    leader, child = group
    other = os.getpid()  # this test: another process group
    apps = [(leader.pid, 1000), (child, 3000), (other, 70000)]
    assert gpu_memory_of_group(leader.pid, apps) == 4000
    assert gpu_memory_of_group(leader.pid, [(999_999_999, 5)]) == 0  # a pid that is gone


def test_measure_through_nvidia_smi(
    group: tuple[subprocess.Popen[bytes], int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, child = group
    bin_dir = tmp_path / "bin"
    fake_a100_box(bin_dir)
    compute_apps(bin_dir, [(child, 20000), (os.getpid(), 1)])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin")
    assert asyncio.run(measure(leader.pid)) == {"gpu_memory_mb": 20000}


def test_no_nvidia_smi_or_a_failing_one_reports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert asyncio.run(measure(os.getpid())) is None
    failing = tmp_path / "failing"
    fake_smi(failing, "NVIDIA-SMI has failed\n", "", code=9)
    monkeypatch.setenv("PATH", f"{failing}{os.pathsep}/bin{os.pathsep}/usr/bin")
    assert asyncio.run(measure(os.getpid())) is None
