"""What a command's processes use of the GPUs, as ``respool run`` reports it with its heartbeats
(docs/placement.md, "Sharing a GPU", "On the step side").

``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` lists every
process using a GPU and its memory in MiB; the use of a command is the sum over the processes
of its process group and their descendants (a process that left the group with ``setsid`` still
counts while its parent chain leads to the command). No ``nvidia-smi``, one that fails or one
that does not answer within :data:`TIMEOUT`: nothing is reported (``None``), never a guess.

The pids are this machine's: in a container whose PID namespace is not the host's, nvidia-smi
may list pids this process cannot see, and the use reads 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Iterable

__all__ = ["QUERY", "TIMEOUT", "USAGE_KEY", "gpu_memory_of_group", "measure", "parse_compute_apps"]

QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
TIMEOUT = 10.0
USAGE_KEY = "gpu_memory_mb"


def parse_compute_apps(text: str) -> list[tuple[int, int]]:
    """(pid, MiB used) per line of ``--query-compute-apps``; lines of another shape (``[N/A]``
    where a driver cannot tell) are skipped."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            apps.append((int(parts[0]), int(parts[1])))
    return apps


def _parent(pid: int) -> int | None:
    """The parent pid of ``pid`` from ``/proc`` (None: gone, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _ours(pid: int, pgid: int) -> bool:
    """Whether ``pid`` is in process group ``pgid`` or descends from its leader."""
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pgid:
            return True
    seen = 0
    while pid > 1 and seen < 64:
        parent = _parent(pid)
        if parent is None:
            return False
        if parent == pgid:
            return True
        pid, seen = parent, seen + 1
    return False


def gpu_memory_of_group(pgid: int, apps: Iterable[tuple[int, int]]) -> int:
    """MiB used by the processes of group ``pgid`` (and their descendants) among ``apps``."""
    return sum(mib for pid, mib in apps if _ours(pid, pgid))


async def measure(pgid: int) -> dict[str, int] | None:
    """``{"gpu_memory_mb": N}``: what group ``pgid`` uses now; None when nvidia-smi cannot
    tell (see the module docstring)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = await asyncio.create_subprocess_exec(
            smi,
            *QUERY,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return None
    if proc.returncode != 0:
        return None
    apps = parse_compute_apps(out.decode(errors="replace"))
    return {USAGE_KEY: gpu_memory_of_group(pgid, apps)}
