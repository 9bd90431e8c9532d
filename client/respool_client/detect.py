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

Sharing (docs/placement.md, "Sharing a GPU"): asked with ``sharing={"gpu": "mps"}`` (the
options ``--sharing gpu=mps``), the ``gpu`` key holds the whole GPUs only and its
``device_memory_mb`` is their ``memory.total`` (the smallest, when they differ); MIG instances
stay whole devices, under a key of their own per MIG profile (``1g.10gb`` →
``mig_1g_10gb``), never shared. Without sharing, detection is as above.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from respool_client.pairs import mebibytes
from respool_client.wire import Node

__all__ = [
    "GPU_TYPE_LABEL",
    "Gpu",
    "Machine",
    "detect",
    "gpu_type",
    "memory_map",
    "mig_key",
    "node_path",
    "parse_gpus",
    "parse_mig",
    "parse_mig_profiles",
    "registration",
    "sharing_map",
]

SHARING_MODES = ("mps", "time-slicing")

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
    # shared device keys (docs/placement.md, "Sharing a GPU"); empty: whole devices only
    sharing: dict[str, str] = field(default_factory=dict)
    device_memory_mb: dict[str, int] = field(default_factory=dict)
    # what the probe saw, for sharing: the whole GPUs' smallest memory.total (MiB), and the
    # MIG instances per key of their profile
    gpu_memory_mb: int | None = None
    mig: dict[str, list[str]] = field(default_factory=dict)


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
    by_gpu = parse_mig_profiles(text)
    return {gpu: [uuid for _profile, uuid in migs] for gpu, migs in by_gpu.items()}


def parse_mig_profiles(text: str) -> dict[int, list[tuple[str, str]]]:
    """``nvidia-smi -L``: (profile, MIG UUID) of the MIG devices under each GPU index."""
    out: dict[int, list[tuple[str, str]]] = {}
    current: int | None = None
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            current = int(gpu.group(1))
            continue
        mig = _MIG_LINE.match(line)
        if mig and current is not None:
            out.setdefault(current, []).append((mig.group(1), mig.group(3).strip()))
    return out


def mig_key(profile: str) -> str:
    """The device key of a MIG profile: ``1g.10gb`` → ``mig_1g_10gb`` (a resource key has
    lower-case letters, digits and ``_`` only)."""
    return ("mig_" + re.sub(r"[^a-z0-9]+", "_", profile.lower()).strip("_"))[:63]


def _mebibytes(memory: str) -> int | None:
    """``"81920 MiB"`` → 81920; None when nvidia-smi wrote something else."""
    parts = memory.split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1] == "MiB":
        return int(parts[0])
    return None


def sharing_map(items: list[str]) -> dict[str, str]:
    """``["gpu=mps"]`` → ``{"gpu": "mps"}``; ``ValueError`` naming the pair for another
    mode or shape (the server checks the key)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, mode = item.partition("=")
        key, mode = key.strip(), mode.strip()
        if not sep or not key or mode not in SHARING_MODES:
            raise ValueError(f"{item!r}: expected KEY=mps or KEY=time-slicing (gpu=mps)")
        out[key] = mode
    return out


def memory_map(items: list[str], minimum: int = 1) -> dict[str, int]:
    """``["gpu=81920"]``, ``["gpu=80GiB"]`` → ``{"gpu": 81920}`` (MiB); ``ValueError`` naming
    the pair for a size that is not one (:func:`respool_client.pairs.mebibytes`)."""
    out: dict[str, int] = {}
    for item in items:
        key, sep, size = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r}: expected KEY=SIZE (gpu=81920, gpu=80GiB)")
        out[key.strip()] = mebibytes(size, minimum)
    return out


def _share(machine: Machine, sharing: dict[str, str]) -> None:
    """Make ``machine``'s ``gpu`` key shared as ``sharing`` asks (see the module docstring)."""
    mode = sharing.get("gpu")
    if mode is None:
        return
    if "gpu" not in machine.devices:
        machine.notes.append("no GPU found: nothing to share (--sharing gpu ignored)")
        return
    mig_ids = {i for ids in machine.mig.values() for i in ids}
    whole = [i for i in machine.devices["gpu"] if i not in mig_ids]
    for key, ids in machine.mig.items():
        machine.devices[key] = ids
        machine.capacity[key] = len(ids)
    if mig_ids:
        machine.notes.append(
            f"{len(mig_ids)} MIG devices stay whole devices of their own key: "
            + ", ".join(sorted(machine.mig))
        )
    if not whole:
        del machine.devices["gpu"], machine.capacity["gpu"]
        machine.notes.append("every GPU is split in MIG instances: no gpu to share")
        return
    machine.devices["gpu"], machine.capacity["gpu"] = whole, len(whole)
    if machine.gpu_memory_mb is None:
        machine.notes.append("nvidia-smi gave no memory.total: give --device-memory gpu=SIZE")
    else:
        machine.device_memory_mb["gpu"] = machine.gpu_memory_mb
    machine.sharing["gpu"] = mode


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
        profiles = parse_mig_profiles(_nvidia_smi("-L"))
    except (OSError, RuntimeError) as exc:
        profiles = {}
        machine.notes.append(f"cannot list MIG devices ({exc}); using whole GPUs")
    mig = {index: [uuid for _, uuid in found] for index, found in profiles.items()}
    for found in profiles.values():
        for profile, uuid in found:
            machine.mig.setdefault(mig_key(profile), []).append(uuid)
    memories = [_mebibytes(g.memory) for g in gpus if g.index not in mig]
    if memories and None not in memories:
        machine.gpu_memory_mb = min(m for m in memories if m is not None)
        if len(set(memories)) > 1:
            machine.notes.append(
                "GPUs of different memory: device_memory_mb is the smallest,"
                f" {machine.gpu_memory_mb}"
            )
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


def detect(*, meminfo: str = "/proc/meminfo", sharing: dict[str, str] | None = None) -> Machine:
    """Probe this machine (see the module docstring); ``sharing``: the device keys to share."""
    machine = Machine()
    _probe_gpus(machine)
    _share(machine, sharing or {})
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
    sharing: dict[str, str] | None = None,
    device_memory_mb: dict[str, int] | None = None,
    reserved_memory_mb: dict[str, int] | None = None,
) -> tuple[str, str, dict[str, Any]]:
    """The call (method, path, JSON body) that registers node ``name`` with these units, given
    the node as it is (``old``; None: not registered): a create, or an update that makes it
    match (see the module docstring). ``pool`` None leaves a node where it is (a create: the
    server's default). ``sharing``, ``device_memory_mb``, ``reserved_memory_mb``: the shared
    device keys (docs/placement.md, "Sharing a GPU"), sent when given."""
    shared = {
        name: value
        for name, value in (
            ("sharing", sharing),
            ("device_memory_mb", device_memory_mb),
            ("reserved_memory_mb", reserved_memory_mb),
        )
        if value
    }
    if old is None:
        body: dict[str, Any] = {
            "name": name,
            "capacity": capacity,
            "devices": devices,
            "labels": labels,
        }
        if pool is not None:
            body["pool"] = pool
        return "POST", "/v1/nodes", body | shared
    # a shared device key's memory and share are derived from its devices, never sent
    derived = {f"{key}_{unit}" for key in old.sharing for unit in ("memory_mb", "share")}
    patch: dict[str, Any] = {
        "capacity": {k: 0 for k in old.capacity if k not in capacity and k not in derived}
        | capacity,
        "devices": {k: None for k in old.devices if k not in devices} | devices,
    }
    new_labels: dict[str, str | None] = dict(labels)
    if detected and GPU_TYPE_LABEL in old.labels and GPU_TYPE_LABEL not in labels:
        new_labels[GPU_TYPE_LABEL] = None  # its GPUs are gone
    if new_labels:
        patch["labels"] = new_labels
    if pool is not None:
        patch["pool"] = pool
    return "PATCH", node_path(name), patch | shared
