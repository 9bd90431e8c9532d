"""The declarative file of ``respool apply`` / ``respool export`` and the plan the server answers.

A manifest is the full desired state of the pools and nodes it names: a field left out means
its default (``description: ""``, ``queueing: best_effort``, no reserved share, no label...).
Pools are matched by name, policies by (pool, subject), nodes by name. ``POST /v1/apply`` takes
a manifest and answers a :class:`Plan`: the changes, field by field, and what the engine did
about them (docs/cli.md).

``nodes`` left out (null) means the file does not manage nodes: none is created, changed or
pruned. A pool with nodes has no capacity of its own (it is the sum of its nodes'), so its
``capacity`` is left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC
from typing import Any, Literal
from uuid import UUID

import msgspec
from respool_client.wire import Node, Policy, PolicyWindow, Pool, RateSpec, Windows

__all__ = [
    "Change",
    "Consequence",
    "FieldChange",
    "Manifest",
    "NodeSpec",
    "Overcommit",
    "Plan",
    "PolicySpec",
    "PoolSpec",
    "current_manifest",
    "duplicate_names",
    "duplicate_nodes",
    "naive_instant",
    "node_capacity",
    "windows_key",
]

Action = Literal["create", "update", "delete"]
Kind = Literal["pool", "policy", "node"]


class PolicySpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A policy; ``subject`` may be a pattern with ``*`` (a team's quota). ``windows``: when its
    reserved share is in force (null: always), the API's window objects (docs/preemption.md)."""

    subject: str
    priority: int = 0
    reserved: dict[str, int] = {}
    limit: dict[str, int] = {}
    description: str = ""
    priority_lane: bool = False
    windows: Windows | None = None


class PoolSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    name: str
    description: str = ""
    capacity: dict[str, int] = {}
    queueing: Literal["best_effort", "strict"] = "best_effort"
    preemption_grace_seconds: int = 0
    starvation_seconds: int | None = 300  # null turns the starvation guard off (docs/scheduling.md)
    ordering: Literal["fifo", "fair"] = "fifo"  # fair share: docs/scheduling.md
    placement: Literal["pack", "spread"] = "pack"  # pools with nodes: docs/placement.md
    rates: dict[str, RateSpec] = {}  # rate keys: docs/rates.md
    # use above a slice of a shared device: docs/placement.md, "Sharing a GPU"
    slice_overuse: Literal["report", "terminate"] = "report"
    policies: list[PolicySpec] = []


class NodeSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A node (docs/placement.md). A key listed in ``devices`` may be left out of ``capacity``:
    its units are its ids."""

    name: str
    pool: str | None = None  # null: registered, in no pool
    labels: dict[str, str] = {}
    capacity: dict[str, int] = {}
    devices: dict[str, list[str]] = {}
    state: Literal["active", "cordoned", "draining"] = "active"
    # shared devices (docs/placement.md, "Sharing a GPU"), keyed by a device key
    sharing: dict[str, Literal["mps", "time-slicing"]] = {}
    device_memory_mb: dict[str, int] = {}
    reserved_memory_mb: dict[str, int] = {}


class Manifest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pools: list[PoolSpec] = []
    nodes: list[NodeSpec] | None = None  # null: the file leaves nodes alone


class FieldChange(msgspec.Struct, frozen=True):
    """One field (``capacity.gpu``, ``queueing``...); ``None`` means absent."""

    field: str
    old: Any
    new: Any


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """One thing to create, update or delete. A node's change names it in ``node``; its
    ``pool`` is the node's pool after the change (before, for a deletion), ``""`` for none."""

    action: Action
    kind: Kind
    pool: str
    subject: str | None = None
    node: str | None = None
    fields: list[FieldChange] = []

    @property
    def label(self) -> str:
        if self.kind == "node":
            return self.node or ""
        return self.pool if self.subject is None else f"{self.pool}/{self.subject}"


_WEEK = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _window_key(w: PolicyWindow) -> tuple[str, ...]:
    if w.start is not None or w.end is not None:
        return tuple("" if t is None else t.astimezone(UTC).isoformat() for t in (w.start, w.end))
    days = sorted(set(w.days or _WEEK), key=_WEEK.index)
    return (w.timezone or "", ",".join(days), w.from_ or "", w.to or "")


def windows_key(windows: Iterable[PolicyWindow] | None) -> tuple[tuple[str, ...], ...] | None:
    """What ``windows`` mean, comparable: a weekly window's days default to every day and
    have no order, a one-time window's instants are compared in UTC, and the order of the
    windows does not matter; None (always in force) stays None."""
    return None if windows is None else tuple(sorted({_window_key(w) for w in windows}))


def _compact(windows: Iterable[PolicyWindow] | None) -> list[PolicyWindow] | None:
    """Windows as ``export`` writes them: a weekly window of every day without ``days``."""
    if windows is None:
        return None
    every = set(_WEEK)
    return [
        msgspec.structs.replace(w, days=None) if w.days and set(w.days) == every else w
        for w in windows
    ]


def node_capacity(spec: NodeSpec) -> dict[str, int]:
    """``spec.capacity`` with each key of ``devices`` it leaves out (its units: its ids)."""
    return {k: len(v) for k, v in spec.devices.items()} | spec.capacity


def _node_spec(n: Node) -> NodeSpec:
    # (the slice counters of a shared key are derived from its devices: not part of the spec)
    derived = {f"{k}{suffix}" for k in n.sharing for suffix in ("_memory_mb", "_share")}
    return NodeSpec(
        name=n.name,
        pool=n.pool,
        labels=dict(sorted(n.labels.items())),
        capacity={k: v for k, v in sorted(n.capacity.items()) if k not in derived},
        devices={k: list(v) for k, v in sorted(n.devices.items())},
        state=n.state,
        sharing=dict(sorted(n.sharing.items())),
        device_memory_mb=dict(sorted(n.device_memory_mb.items())),
        reserved_memory_mb=dict(sorted(n.reserved_memory_mb.items())),
    )


def current_manifest(
    pools: Iterable[Pool], policies: Iterable[Policy], nodes: Iterable[Node] = ()
) -> Manifest:
    """The manifest that describes ``pools``, their ``policies`` and ``nodes`` (what ``export``
    writes). A pool with nodes is written without capacity: it is the sum of its nodes'."""
    by_pool: dict[str, list[PolicySpec]] = {}
    for pol in sorted(policies, key=lambda p: (p.pool, p.subject)):
        by_pool.setdefault(pol.pool, []).append(
            PolicySpec(
                subject=pol.subject,
                priority=pol.priority,
                reserved=dict(sorted(pol.reserved.items())),
                limit=dict(sorted(pol.limit.items())),
                description=pol.description,
                priority_lane=pol.priority_lane,
                windows=_compact(pol.windows),
            )
        )
    return Manifest(
        pools=[
            PoolSpec(
                name=p.name,
                description=p.description,
                capacity={} if p.nodes else dict(sorted(p.capacity.items())),
                queueing=p.queueing,
                preemption_grace_seconds=p.preemption_grace_seconds,
                starvation_seconds=p.starvation_seconds,
                ordering=p.ordering,
                placement=p.placement,
                slice_overuse=p.slice_overuse,
                rates={
                    k: RateSpec(amount=r.amount, per_seconds=r.per_seconds)
                    for k, r in sorted(p.rates.items())
                },
                policies=by_pool.get(p.name, []),
            )
            for p in sorted(pools, key=lambda p: p.name)
        ],
        nodes=[_node_spec(n) for n in sorted(nodes, key=lambda n: n.name)],
    )


def duplicate_names(manifest: Manifest) -> list[str]:
    """Pools named twice, and subjects named twice in one pool (``pool/subject``)."""
    dups: list[str] = []
    seen: set[str] = set()
    for pool in manifest.pools:
        if pool.name in seen:
            dups.append(pool.name)
        seen.add(pool.name)
        subjects: set[str] = set()
        for pol in pool.policies:
            if pol.subject in subjects:
                dups.append(f"{pool.name}/{pol.subject}")
            subjects.add(pol.subject)
    return dups


def naive_instant(manifest: Manifest) -> str | None:
    """The field of the first one-time window instant without a time zone, if any (such an
    instant means nothing on its own: refused)."""
    for i, pool in enumerate(manifest.pools):
        for j, policy in enumerate(pool.policies):
            for k, w in enumerate(policy.windows or []):
                for key, value in (("start", w.start), ("end", w.end)):
                    if value is not None and value.tzinfo is None:
                        return f"pools[{i}].policies[{j}].windows[{k}].{key}"
    return None


def duplicate_nodes(manifest: Manifest) -> list[str]:
    """Nodes named twice."""
    seen: set[str] = set()
    dups: list[str] = []
    for node in manifest.nodes or []:
        if node.name in seen:
            dups.append(node.name)
        seen.add(node.name)
    return dups


class Consequence(msgspec.Struct, frozen=True, kw_only=True):
    """What the apply did to one request: ``path`` is every status it went through."""

    request_id: UUID
    subject: str
    pool: str | None
    from_status: str | None
    to_status: str
    path: list[str]
    reason: str | None
    message: str


class Overcommit(msgspec.Struct, frozen=True, kw_only=True):
    """Usage above a ceiling after the apply (left for the reconciler to preempt)."""

    pool: str
    subject: str | None
    key: str
    used: int
    ceiling: int
    kind: Literal["capacity", "limit"]


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What an apply did (or, with ``dry_run``, would do): the changes, and the engine's
    consequences, preemptions by ``respool.reconcile_pool`` included."""

    dry_run: bool
    applied: bool
    changes: list[Change]
    consequences: list[Consequence]
    overcommitted: list[Overcommit]
