"""What ``respool node register --detect`` and ``respool agent --register --detect`` find on this
machine (docs/cli.md, "Nodes"), and the one call that registers it (:func:`registration`).

* GPUs from ``nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader``.
  The ``gpu`` device ids are the GPU indices (``"0"`` … ``"7"``): ``CUDA_VISIBLE_DEVICES``
  takes them as given, and they are what people read in ``nvidia-smi``'s own table.
* MIG: when ``nvidia-smi -L`` lists MIG devices under a GPU, that GPU is not one device but
  its MIG instances; their ids are the MIG UUIDs (``MIG-…``), which is the only way to name a
  MIG instance in ``CUDA_VISIBLE_DEVICES``. A GPU without MIG instances keeps its index, so a
  box with both kinds lists the indices of the whole GPUs and the UUIDs of the instances.
* A ``gpu-type`` label from the product name: the vendor words (``NVIDIA``, ``Tesla``) dropped
  and spaces made ``-`` (``NVIDIA A100-SXM4-80GB`` → ``A100-SXM4-80GB``, ``NVIDIA H100 80GB
  HBM3`` → ``H100-80GB-HBM3``), so a selector reads ``gpu-type=A100-SXM4-80GB``.
* ``mcpu``: the CPUs this process may run on (its affinity, else ``os.cpu_count()``) × 1000.
* ``memory_mb``: ``MemTotal`` of ``/proc/meminfo`` (KiB) in megabytes of 10^6 bytes, floored.

No ``nvidia-smi``, or one that fails (no driver), is a machine without GPUs: the probe says
so in :attr:`Machine.notes` and goes on.

Registering again makes the node match what was found: keys and device lists it no longer has
are removed, a ``gpu-type`` label of GPUs that are gone too; other labels stay.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from respool_client.wire import Node

__all__ = [
    "GPU_TYPE_LABEL",
    "Gpu",
    "Machine",
    "detect",
    "gpu_type",
    "node_path",
    "parse_gpus",
    "parse_mig",
    "registration",
]

QUERY = ["--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader"]
TIMEOUT = 30.0
GPU_TYPE_LABEL = "gpu-type"
_VENDOR_WORDS = ("nvidia", "tesla")
_GPU_LINE = re.compile(r"^GPU (\d+): .*\(UUID: ([^)]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)\s*$")


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory: str  # as nvidia-smi wrote it, "81920 MiB"


@dataclass
class Machine:
    """What the probe found: a node's capacity, devices and labels, and notes for people."""

    capacity: dict[str, int] = field(default_factory=dict)
    devices: dict[str, list[str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def gpu_type(product: str) -> str:
    """The ``gpu-type`` label of a product name (see the module docstring)."""
    words = product.split()
    while len(words) > 1 and words[0].lower() in _VENDOR_WORDS:
        words = words[1:]
    return "-".join(words)[:63]


def parse_gpus(text: str) -> list[Gpu]:
    """The rows of the ``--query-gpu`` CSV; ValueError on a line of another shape."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            raise ValueError(f"unexpected nvidia-smi line: {line.strip()!r}")
        gpus.append(Gpu(int(parts[0]), parts[1], parts[2], parts[3]))
    return sorted(gpus, key=lambda g: g.index)


def parse_mig(text: str) -> dict[int, list[str]]:
    """``nvidia-smi -L``: the MIG device UUIDs under each GPU index, in listing order (GPUs
    without MIG devices are left out)."""
    out: dict[int, list[str]] = {}
    current: int | None = None
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            current = int(gpu.group(1))
            continue
        mig = _MIG_LINE.match(line)
        if mig and current is not None:
            out.setdefault(current, []).append(mig.group(3).strip())
    return out


def _nvidia_smi(*args: str) -> str:
    """stdout of ``nvidia-smi ARGS``; OSError/RuntimeError with one line on failure."""
    try:
        done = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"nvidia-smi did not answer within {TIMEOUT:g}s") from None
    if done.returncode != 0:
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        why = said[0].strip() if said else f"exit code {done.returncode}"
        raise RuntimeError(f"nvidia-smi failed: {why}")
    return done.stdout


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _memory_mb(meminfo: str = "/proc/meminfo") -> int | None:
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    kib = int(line.split()[1])
                    return kib * 1024 // 1_000_000
    except (OSError, ValueError, IndexError):
        return None
    return None


def _probe_gpus(machine: Machine) -> None:
    try:
        gpus = parse_gpus(_nvidia_smi(*QUERY))
    except FileNotFoundError:
        machine.notes.append("no nvidia-smi on PATH: registering a machine with no GPU")
        return
    except (OSError, RuntimeError, ValueError) as exc:
        machine.notes.append(f"{exc}; registering a machine with no GPU")
        return
    if not gpus:
        machine.notes.append("nvidia-smi lists no GPU: registering a machine with no GPU")
        return
    try:
        mig = parse_mig(_nvidia_smi("-L"))
    except (OSError, RuntimeError) as exc:
        mig = {}
        machine.notes.append(f"cannot list MIG devices ({exc}); using whole GPUs")
    ids: list[str] = []
    for gpu in gpus:
        ids.extend(mig.get(gpu.index, [str(gpu.index)]))
    machine.capacity["gpu"] = len(ids)
    machine.devices["gpu"] = ids
    types = sorted({gpu_type(g.name) for g in gpus})
    machine.labels[GPU_TYPE_LABEL] = gpu_type(gpus[0].name)
    if len(types) > 1:
        machine.notes.append(
            f"GPUs of several types ({', '.join(types)}): labelled {GPU_TYPE_LABEL}="
            f"{machine.labels[GPU_TYPE_LABEL]} (GPU 0's)"
        )
    if mig:
        n = sum(len(v) for v in mig.values())
        machine.notes.append(f"{n} MIG devices: their MIG UUIDs are the gpu device ids")


def detect(*, meminfo: str = "/proc/meminfo") -> Machine:
    """Probe this machine (see the module docstring)."""
    machine = Machine()
    _probe_gpus(machine)
    machine.capacity["mcpu"] = _cpus() * 1000
    memory = _memory_mb(meminfo)
    if memory:
        machine.capacity["memory_mb"] = memory
    else:
        machine.notes.append(f"cannot read MemTotal from {meminfo}: memory_mb left out")
    return machine


def node_path(name: str) -> str:
    """``/v1/nodes/{name}``, the name escaped."""
    return f"/v1/nodes/{quote(name, safe='')}"


def registration(
    old: Node | None,
    name: str,
    *,
    pool: str | None,
    capacity: dict[str, int],
    devices: dict[str, list[str]],
    labels: dict[str, str],
    detected: bool,
) -> tuple[str, str, dict[str, Any]]:
    """The call (method, path, JSON body) that registers node ``name`` with these units, given
    the node as it is (``old``; None: not registered): a create, or an update that makes it
    match (see the module docstring). ``pool`` None leaves a node where it is (a create: the
    server's default)."""
    if old is None:
        body: dict[str, Any] = {
            "name": name,
            "capacity": capacity,
            "devices": devices,
            "labels": labels,
        }
        if pool is not None:
            body["pool"] = pool
        return "POST", "/v1/nodes", body
    patch: dict[str, Any] = {
        "capacity": {k: 0 for k in old.capacity if k not in capacity} | capacity,
        "devices": {k: None for k in old.devices if k not in devices} | devices,
    }
    new_labels: dict[str, str | None] = dict(labels)
    if detected and GPU_TYPE_LABEL in old.labels and GPU_TYPE_LABEL not in labels:
        new_labels[GPU_TYPE_LABEL] = None  # its GPUs are gone
    if new_labels:
        patch["labels"] = new_labels
    if pool is not None:
        patch["pool"] = pool
    return "PATCH", node_path(name), patch
