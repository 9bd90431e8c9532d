"""The options of a request body (``respool request create``, ``respool submit``), declared once
as ``Annotated`` types and grouped in :class:`RequestFields`, which turns them into the wire type
the API decodes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, TypeVar

import typer
from msgspec import UNSET, UnsetType
from respool_client.durations import parse_duration
from respool_client.pairs import mebibytes, percent, raising
from respool_client.wire import GROUP_PATTERN, MAX_BATCH, RequestCreate, ResourceSettings

from cli.complete import complete_node, complete_pool, complete_subject
from cli.maps import parse_decimal, parse_labels, parse_pairs, parse_selector

__all__ = [
    "Count",
    "DryRun",
    "Gang",
    "KeepQueued",
    "Wait",
    "Cpu",
    "Gpu",
    "GpuMemory",
    "GpuShare",
    "Group",
    "IdempotencyKey",
    "Label",
    "Lease",
    "LeaseOption",
    "MaxRetries",
    "MaxSeconds",
    "Memory",
    "NodeChoice",
    "NonPreemptible",
    "PoolChoice",
    "RequestFields",
    "Resource",
    "Selector",
    "Subject",
    "parse_lease",
]


T = TypeVar("T")


@dataclass(frozen=True)
class Lease:
    """``--lease`` as given: a number of seconds, or None for no lease at all."""

    seconds: int | None


def parse_lease(text: str) -> Lease:
    """``none`` → no lease; a duration (``5m``, ``1h30m``) or whole seconds (``90``) → it."""
    if text.strip().lower() == "none":
        return Lease(None)
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{exc}, or none for no lease") from None
    if seconds < 1 or seconds != int(seconds):
        raise typer.BadParameter(f"{text!r}: a lease is whole seconds, at least 1 (or none)")
    return Lease(int(seconds))


Subject = Annotated[
    str,
    typer.Option(
        "--subject",
        "-s",
        help="Who asks, e.g. orchestrator:prod.",
        autocompletion=complete_subject,
    ),
]
PoolChoice = Annotated[
    str | None,
    typer.Option(
        "--pool",
        help="Only this pool (default: every pool with a policy).",
        autocompletion=complete_pool,
    ),
]
Gpu = Annotated[int | None, typer.Option("--gpu", min=0, help="GPUs (gpu).")]
Cpu = Annotated[
    Decimal | None,
    typer.Option("--cpu", parser=parse_decimal, help="CPUs, e.g. 0.5 (mcpu = ceil(x*1000))."),
]
Memory = Annotated[
    str | None,
    typer.Option(
        "--memory",
        help="Memory (memory_mb): 8G or 8GB is 8x10^9 bytes (as in Kubernetes), 16Gi or 16GiB"
        " is 16x2^30 (Slurm's 16G).",
    ),
]


parse_gpu_memory = raising(mebibytes, typer.BadParameter)  # --gpu-memory: 20GiB, 512MiB or MiB
parse_gpu_share = raising(percent, typer.BadParameter)  # --gpu-share: a whole percent, 1 to 100


GpuMemory = Annotated[
    int | None,
    typer.Option(
        "--gpu-memory",
        parser=parse_gpu_memory,
        metavar="SIZE",
        help="A slice of one shared GPU with this much memory (gpu_memory_mb): 20GiB, 512MiB"
        " or MiB as a number.",
    ),
]
GpuShare = Annotated[
    int | None,
    typer.Option(
        "--gpu-share",
        parser=parse_gpu_share,
        metavar="PERCENT",
        help="With --gpu-memory: this share of the GPU's compute, 1 to 100 (gpu_share).",
    ),
]
Resource = Annotated[
    list[str] | None,
    typer.Option("--resource", "-r", help="Any key, KEY=N; repeat for more (tpu=2)."),
]
Label = Annotated[
    list[str] | None, typer.Option("--label", help="KEY=VALUE label; repeat for more.")
]
Selector = Annotated[
    list[str] | None,
    typer.Option(
        "--selector",
        metavar="KEY=VALUE",
        help="Only a node with this label, e.g. gpu-type=A100-80G; repeat: all of them"
        " (pools with nodes).",
    ),
]
NodeChoice = Annotated[
    str | None,
    typer.Option(
        "--node", help="Only this node (the selector node=NAME).", autocompletion=complete_node
    ),
]
Group = Annotated[
    str | None,
    typer.Option(
        "--group",
        metavar="G",
        help="Preemption group: it never preempts an allocation of the same group (e.g. the"
        " other steps of one pipeline run).",
    ),
]
NonPreemptible = Annotated[
    bool,
    typer.Option("--non-preemptible", help="Never preempted; must fit the reserved share."),
]
MaxRetries = Annotated[
    int, typer.Option("--max-retries", min=0, help="Requeues after a preemption.")
]
LeaseOption = Annotated[
    Lease | None,
    typer.Option(
        "--lease",
        parser=parse_lease,
        metavar="DURATION|none",
        show_default=False,
        help="Lease: seconds or a duration (90, 5m, 1h); none for no lease at all"
        " (left out: the server's default).",
    ),
]
IdempotencyKey = Annotated[
    str | None, typer.Option("--idempotency-key", help="Retries with it get the same request.")
]
MaxSeconds = Annotated[
    int | None,
    typer.Option(
        "--max-seconds",
        min=1,
        help="Hard runtime cap: expired this many seconds after the grant, heartbeats or not"
        " (lets it backfill while a pool holds for a starving request).",
    ),
]


# How create goes about it (not part of the body).
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="What would happen now to this one request: status, queue position, message,"
        " ETA and what the reconciler would preempt for it. Nothing is created. Exit 1 if"
        " it would be rejected. Not with --count or --gang.",
    ),
]

Count = Annotated[
    int,
    typer.Option(
        "--count",
        min=1,
        max=MAX_BATCH,
        help="Create this many alike requests in one transaction (a batch, in queue order); "
        "with --idempotency-key K, member i gets the key K-i.",
    ),
]

Gang = Annotated[
    bool,
    typer.Option(
        "--gang",
        help="With --count: the requests are a gang, granted all together in one pool or"
        " not at all, and rejected, preempted, expired and cancelled together"
        " (docs/scheduling.md). Also spelled --all-or-nothing.",
    ),
]
AllOrNothing = Annotated[bool, typer.Option("--all-or-nothing", hidden=True)]

Wait = Annotated[
    float | None,
    typer.Option(
        "--wait",
        min=0,
        help="Wait up to this many seconds for the allocation, with a live status. "
        "Exit code 0 only when allocated.",
    ),
]

KeepQueued = Annotated[
    bool,
    typer.Option(
        "--keep-queued", help="With --wait: leave it queued on timeout (default: cancel)."
    ),
]


@dataclass(frozen=True)
class RequestFields:
    """The options of a request body but its subject: ``request create``'s and ``submit``'s."""

    pool: PoolChoice = None
    gpu: Gpu = None
    cpu: Cpu = None
    memory: Memory = None
    gpu_memory: GpuMemory = None
    gpu_share: GpuShare = None
    resource: Resource = None
    label: Label = None
    non_preemptible: NonPreemptible = False
    max_retries: MaxRetries = 0
    lease: LeaseOption = None
    select: Selector = None
    node: NodeChoice = None
    group: Group = None

    def body(self, subject: str, **more: Any) -> RequestCreate:
        """The create body of these options (``select`` is ``--selector``) and ``more`` of its
        fields (``idempotency_key``, ``max_seconds``)."""
        gpu, cpu, memory = _set(self.gpu), _set(self.cpu), _set(self.memory)
        settings = ResourceSettings(gpu_count=gpu, cpu_count=cpu, memory=memory)
        return RequestCreate(
            subject=subject,
            pool=self.pool,
            settings=settings if settings.to_json() else None,
            resources=self.resources() or None,
            labels=parse_labels(self.label or []) or None,
            preemptible=not self.non_preemptible,
            max_retries=self.max_retries,
            # left out: the server's default
            lease_seconds=UNSET if self.lease is None else self.lease.seconds,
            **more,
            node_selector=parse_selector(self.select or [], self.node) or None,
            preemption_group=_group(self.group),
        )

    def resources(self) -> dict[str, int]:
        """``--resource`` pairs, and a slice of one shared GPU: ``--gpu-memory`` as
        ``gpu_memory_mb``, ``--gpu-share`` as ``gpu_share`` (docs/placement.md, "Sharing a
        GPU")."""
        out = parse_pairs(self.resource or [], "--resource")
        if self.gpu_share is not None and self.gpu_memory is None:
            raise typer.BadParameter(
                "a share is of a slice: give --gpu-memory too", param_hint="--gpu-share"
            )
        if self.gpu is not None and self.gpu_memory is not None:
            raise typer.BadParameter(
                "whole GPUs (--gpu) or one slice (--gpu-memory), not both",
                param_hint="--gpu-memory",
            )
        for option, key, value in (
            ("--gpu-memory", "gpu_memory_mb", self.gpu_memory),
            ("--gpu-share", "gpu_share", self.gpu_share),
        ):
            if value is None:
                continue
            if key in out and out[key] != value:
                raise typer.BadParameter(
                    f"{option} and --resource {key}={out[key]} disagree", param_hint=option
                )
            out[key] = value
        return out


def _group(group: str | None) -> str | None:
    """``--group``: 1 to 128 printable characters (as the server checks it)."""
    if group is not None and not re.fullmatch(GROUP_PATTERN, group):
        raise typer.BadParameter("1 to 128 printable characters", param_hint="--group")
    return group


def _set(value: T | None) -> T | UnsetType:
    """An option left out (None) is a field left unset."""
    return UNSET if value is None else value
