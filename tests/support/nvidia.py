"""A fake ``nvidia-smi`` on PATH printing what a real one prints on an 8×A100 box (or whatever a
test gives it): ``respool node register --detect`` and ``respool agent --register --detect``
read it as they read a real one."""

from __future__ import annotations

import stat
from pathlib import Path

__all__ = ["A100_LIST", "A100_QUERY", "A100_UUIDS", "fake_smi", "gpus"]

A100_UUIDS = [f"GPU-{i}a1b2c3d-0000-1111-2222-33334444555{i}" for i in range(8)]
A100_QUERY = "".join(
    f"{i}, {u}, NVIDIA A100-SXM4-80GB, 81920 MiB\n" for i, u in enumerate(A100_UUIDS)
)
A100_LIST = "".join(
    f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: {u})\n" for i, u in enumerate(A100_UUIDS)
)


def gpus(n: int) -> tuple[str, str]:
    """(query, listing) of a box with the first ``n`` of those A100s."""
    return "".join(A100_QUERY.splitlines(True)[:n]), "".join(A100_LIST.splitlines(True)[:n])


def fake_smi(bin_dir: Path, query: str, listing: str, code: int = 0) -> None:
    """An executable ``bin_dir/nvidia-smi`` that prints ``listing`` for ``-L``, else ``query``,
    and exits with ``code``."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "query.txt").write_text(query)
    (bin_dir / "list.txt").write_text(listing)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-L" ]; then cat "{bin_dir}/list.txt"; else cat "{bin_dir}/query.txt"; fi\n'
        f"exit {code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
