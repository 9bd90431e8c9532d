"""The allocation a step holds inside ``allocate``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

from respool_client.errors import Preempted
from respool_client.wire import Placement, Request

__all__ = ["Grant", "OnPreempted", "describe_slices", "slice_env", "step_env"]

# The device key whose ids become CUDA_VISIBLE_DEVICES.
GPU_KEY = "gpu"
# Sharing modes of a device key (docs/placement.md, "Sharing a GPU").
MPS = "mps"
TIME_SLICING = "time-slicing"


def step_env(state: Request) -> dict[str, str]:
    """The environment of a step that holds ``state``'s allocation (``docs/client.md``, "The
    step's environment"): ``RESPOOL_REQUEST_ID``, ``RESPOOL_POOL``, ``RESPOOL_ATTEMPT``,
    ``RESPOOL_RESOURCES`` (JSON); when the allocation is placed on a node (a pool with nodes),
    ``RESPOOL_NODE`` (the node's name) and ``RESPOOL_DEVICES`` (JSON ``{key: [ids]}``, ``{}``
    without named devices); and when gpu devices were placed, ``CUDA_VISIBLE_DEVICES``: their
    ids joined by commas in the order given (indices, GPU UUIDs and MIG ids work as they are).

    A slice of a shared device (docs/placement.md, "Sharing a GPU") adds, per sliced key ``K``,
    ``RESPOOL_<K>_MEMORY_MB`` and (a share asked) ``RESPOOL_<K>_SHARE``, and
    ``RESPOOL_<K>_ISOLATION`` for every placed device key with an isolation (``exclusive``,
    ``mps``, ``time-slicing``); for the gpu key under ``mps`` also
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=<memory_mb>M"`` (device 0: the only one the step
    sees) and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<share>`` (a share asked). Under
    ``time-slicing`` nothing is enforced by the driver: the slice is a promise kept by
    counting only.

    A variable left out here is not the grant's to set: ``respool run`` passes the caller's
    value through (e.g. ``CUDA_VISIBLE_DEVICES`` in a pool without nodes)."""
    env = {
        "RESPOOL_REQUEST_ID": str(state.id),
        "RESPOOL_POOL": state.pool or "",
        "RESPOOL_ATTEMPT": str(state.attempt),
        "RESPOOL_RESOURCES": json.dumps(dict(state.resources), sort_keys=True),
    }
    placed = state.placement
    if placed is not None:
        env["RESPOOL_NODE"] = placed.node
        env["RESPOOL_DEVICES"] = json.dumps(placed.devices, sort_keys=True)
        gpus = placed.devices.get(GPU_KEY)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        env.update(slice_env(placed))
    return env


def slice_env(placed: Placement) -> dict[str, str]:
    """The variables of the slices and isolation of ``placed`` (see :func:`step_env`)."""
    env: dict[str, str] = {}
    for key, mode in sorted(placed.isolation.items()):
        if key in placed.devices:
            env[f"RESPOOL_{key.upper()}_ISOLATION"] = mode
    for key, held in sorted(placed.slices.items()):
        if len(held) != 1:  # a request holds at most one slice, of one device
            continue
        ((device, part),) = held.items()
        name = key.upper()
        env[f"RESPOOL_{name}_MEMORY_MB"] = str(part.memory_mb)
        if part.share is not None:
            env[f"RESPOOL_{name}_SHARE"] = str(part.share)
        if key != GPU_KEY:
            continue
        env["CUDA_VISIBLE_DEVICES"] = device  # that one device, also if devices said more
        if placed.isolation.get(key) == MPS:
            # Inside the step its one visible device is device 0.
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={part.memory_mb}M"
            if part.share is not None:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(part.share)
    return env


def describe_slices(placed: Placement) -> list[str]:
    """One line per slice held, for people: ``gpu 3: 20480 MiB, 50% of its compute (mps)``;
    under ``time-slicing`` it says that the driver enforces nothing."""
    lines = []
    for key, held in sorted(placed.slices.items()):
        for device, part in sorted(held.items()):
            share = "" if part.share is None else f", {part.share}% of its compute"
            mode = placed.isolation.get(key, "")
            limited = "memory" if part.share is None else "memory and compute"
            how = {
                MPS: f"mps: {limited} limited by the MPS server",
                TIME_SLICING: "time-slicing: not enforced by the driver, keep within it",
            }.get(mode, mode)
            lines.append(
                f"{key} {device}: a slice of {part.memory_mb} MiB{share}"
                + (f" ({how})" if how else "")
            )
    return lines


class Grant:
    """An allocation held inside ``allocate``.

    ``sent_at`` (``time.monotonic()``) is when the call that saw the allocation was sent: the
    server's lease cannot end before ``sent_at + lease_seconds``, so the grant can tell by
    itself when its lease may have lapsed (no heartbeat got through in time, e.g. the process
    was paused or cut off), without waiting for the server to say so.
    """

    def __init__(self, state: Request, sent_at: float | None = None) -> None:
        self.request_id: UUID = state.id
        self.subject = state.subject
        self.resources: dict[str, int] = dict(state.resources)
        self.pool: str | None = state.pool
        self.attempt: int = state.attempt
        self.lease_seconds: int | None = state.lease_seconds
        self.status: str = state.status
        self.reason: str | None = state.reason
        self.message: str = state.message
        # When the units will be taken by force (``preempting``): stop before then.
        self.deadline: datetime | None = state.preempt_deadline
        self.version: int = state.version
        # Where it runs in a pool with nodes: node, its labels, device ids per key; else None.
        self.placement: Placement | None = state.placement
        self._env = step_env(state)
        self._preempted = threading.Event()
        self._valid_until: float | None = None
        if sent_at is not None:
            self._renewed(sent_at)

    def env(self) -> dict[str, str]:
        """The variables a step holding this grant runs with (a fresh dict each call):
        ``RESPOOL_REQUEST_ID``, ``RESPOOL_POOL``, ``RESPOOL_ATTEMPT``, ``RESPOOL_RESOURCES``,
        and, placed on a node, ``RESPOOL_NODE``, ``RESPOOL_DEVICES`` and (gpu devices placed)
        ``CUDA_VISIBLE_DEVICES``; for a slice of a shared GPU also ``RESPOOL_GPU_MEMORY_MB``,
        ``RESPOOL_GPU_SHARE`` and under MPS its limits (:func:`step_env`): the same that
        ``respool run`` sets for its command.

        ``os.environ.update(grant.env())`` before starting CUDA makes the process use only
        its own GPUs."""
        return dict(self._env)

    def _update(self, state: Request) -> None:
        """Take the status, reason, message and deadline of a newer answer about the request."""
        self.status, self.reason, self.message = state.status, state.reason, state.message
        self.version = max(self.version, state.version)
        if state.preempt_deadline is not None:
            self.deadline = state.preempt_deadline

    def _renewed(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (monotonic) extended the lease; once lapsed, a
        grant stays lapsed (the step was told to stop)."""
        if self.lease_seconds and not self.lease_lapsed:
            self._valid_until = sent_at + self.lease_seconds

    @property
    def lease_lapsed(self) -> bool:
        """True when no heartbeat extended the lease within ``lease_seconds``: the server may
        have expired it and granted the units to someone else."""
        return self._valid_until is not None and time.monotonic() >= self._valid_until

    @property
    def preempted(self) -> bool:
        """True once the request was seen preempting, preempted, expired, cancelled or gone,
        or once the lease lapsed (:attr:`lease_lapsed`): stop using the units."""
        return self._preempted.is_set() or self.lease_lapsed

    def wait_preempted(self, timeout: float | None = None) -> bool:
        """Block until :attr:`preempted` turns true (True) or ``timeout`` passes (False)."""
        return self._preempted.wait(timeout) or self.lease_lapsed

    def raise_if_preempted(self) -> None:
        if self.preempted:
            raise Preempted(self.reason, self.message, self.request_id)

    def __repr__(self) -> str:
        return (
            f"Grant(request_id={self.request_id}, pool={self.pool!r}, resources={self.resources}, "
            f"attempt={self.attempt}, node={self.placement and self.placement.node!r}, "
            f"preempted={self.preempted})"
        )


class Reservation(Grant):
    """A grant held inside ``reserve`` (docs/rates.md): its rate keys were charged an
    estimate at the grant; :meth:`settle` records what was really used, and the release at the
    end of the block sends it, so the charge becomes that amount at its original instant (a
    refund, or an extra charge that the pool reports as an overrun). Without ``settle`` the
    estimate stays charged."""

    def __init__(self, state: Request, sent_at: float | None = None) -> None:
        super().__init__(state, sent_at)
        self.used: dict[str, int] | None = None

    def settle(self, **used: int) -> None:
        """The units of rate keys really used, e.g. ``r.settle(llm_tokens=3120)``; sent with
        the release when the block ends. A later call replaces an earlier one's keys."""
        for key, n in used.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"settle: {key} must be an integer >= 0, got {n!r}")
        self.used = {**(self.used or {}), **used}

    def __repr__(self) -> str:
        return (
            f"Reservation(request_id={self.request_id}, pool={self.pool!r},"
            f" resources={self.resources}, used={self.used})"
        )


OnPreempted = Callable[[Grant], object]
