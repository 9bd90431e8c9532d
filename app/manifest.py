"""Declarative pools and policies (``respool apply`` / ``respool export``) and their diff.

A manifest is the full desired state of the pools it names: a field left out means its default
(``description: ""``, ``queueing: best_effort``, no reserved share...). Pools are matched by
name, policies by (pool, subject). :func:`plan_changes` is pure: it compares the current state
with the manifest and returns the changes, field by field, that make them equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec
from respool_client.wire import Policy, Pool

__all__ = [
    "Change",
    "FieldChange",
    "Manifest",
    "PolicySpec",
    "PoolSpec",
    "current_manifest",
    "duplicate_names",
    "merge_map",
    "new_text",
    "new_value",
    "plan_changes",
]

Action = Literal["create", "update", "delete"]
Kind = Literal["pool", "policy"]


class PolicySpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    subject: str
    priority: int = 0
    reserved: dict[str, int] = {}
    limit: dict[str, int] = {}
    description: str = ""


class PoolSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    name: str
    description: str = ""
    capacity: dict[str, int] = {}
    queueing: Literal["best_effort", "strict"] = "best_effort"
    preemption_grace_seconds: int = 0
    starvation_seconds: int | None = 300  # null turns the starvation guard off (docs/scheduling.md)
    ordering: Literal["fifo", "fair"] = "fifo"  # fair share: docs/scheduling.md
    policies: list[PolicySpec] = []


class Manifest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pools: list[PoolSpec] = []


class FieldChange(msgspec.Struct, frozen=True):
    """One field (``capacity.gpu``, ``queueing``...); ``None`` means absent."""

    field: str
    old: Any
    new: Any


class Change(msgspec.Struct, frozen=True, kw_only=True):
    action: Action
    kind: Kind
    pool: str
    subject: str | None = None
    fields: list[FieldChange] = []

    @property
    def label(self) -> str:
        return self.pool if self.subject is None else f"{self.pool}/{self.subject}"


def current_manifest(pools: Iterable[Pool], policies: Iterable[Policy]) -> Manifest:
    """The manifest that describes ``pools`` and their ``policies`` (what ``export`` writes)."""
    by_pool: dict[str, list[PolicySpec]] = {}
    for pol in sorted(policies, key=lambda p: (p.pool, p.subject)):
        by_pool.setdefault(pol.pool, []).append(
            PolicySpec(
                subject=pol.subject,
                priority=pol.priority,
                reserved=dict(sorted(pol.reserved.items())),
                limit=dict(sorted(pol.limit.items())),
                description=pol.description,
            )
        )
    return Manifest(
        pools=[
            PoolSpec(
                name=p.name,
                description=p.description,
                capacity=dict(sorted(p.capacity.items())),
                queueing=p.queueing,
                preemption_grace_seconds=p.preemption_grace_seconds,
                starvation_seconds=p.starvation_seconds,
                ordering=p.ordering,
                policies=by_pool.get(p.name, []),
            )
            for p in sorted(pools, key=lambda p: p.name)
        ]
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


def _map_changes(name: str, old: Mapping[str, int], new: Mapping[str, int]) -> list[FieldChange]:
    """Per-key changes; a 0 counts as absent (the engine drops zeros), so it never diffs."""
    old = {k: v for k, v in old.items() if v != 0}
    new = {k: v for k, v in new.items() if v != 0}
    return [
        FieldChange(f"{name}.{key}", old.get(key), new.get(key))
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]


def _scalar_changes(
    old: msgspec.Struct, new: msgspec.Struct, names: Sequence[str]
) -> list[FieldChange]:
    return [
        FieldChange(n, getattr(old, n), getattr(new, n))
        for n in names
        if getattr(old, n) != getattr(new, n)
    ]


_POOL_SCALARS = (
    "description",
    "queueing",
    "preemption_grace_seconds",
    "starvation_seconds",
    "ordering",
)
_POLICY_SCALARS = ("priority", "description")
_EMPTY_POOL = PoolSpec(name="")


def _pool_fields(old: PoolSpec, new: PoolSpec) -> list[FieldChange]:
    return _map_changes("capacity", old.capacity, new.capacity) + _scalar_changes(
        old, new, _POOL_SCALARS
    )


def _policy_fields(old: PolicySpec, new: PolicySpec) -> list[FieldChange]:
    return (
        _scalar_changes(old, new, _POLICY_SCALARS)
        + _map_changes("reserved", old.reserved, new.reserved)
        + _map_changes("limit", old.limit, new.limit)
    )


def _policy_changes(
    pool: str, old: Sequence[PolicySpec], new: Sequence[PolicySpec], prune: bool
) -> list[Change]:
    current = {p.subject: p for p in old}
    wanted = {p.subject: p for p in new}
    changes: list[Change] = []
    for subject, spec in wanted.items():
        have = current.get(subject)
        if have is None:
            empty = PolicySpec(subject=subject)
            changes.append(
                Change(
                    action="create",
                    kind="policy",
                    pool=pool,
                    subject=subject,
                    fields=_policy_fields(empty, spec),
                )
            )
        elif fields := _policy_fields(have, spec):
            changes.append(
                Change(action="update", kind="policy", pool=pool, subject=subject, fields=fields)
            )
    if prune:
        changes.extend(
            Change(action="delete", kind="policy", pool=pool, subject=s)
            for s in current
            if s not in wanted
        )
    return changes


def plan_changes(current: Manifest, desired: Manifest, *, prune: bool = False) -> list[Change]:
    """What turns ``current`` into ``desired``: pools in manifest order, each followed by its
    policies; with ``prune``, deletions of pools and policies the manifest does not name."""
    have = {p.name: p for p in current.pools}
    wanted = {p.name for p in desired.pools}
    changes: list[Change] = []
    for spec in desired.pools:
        old = have.get(spec.name)
        if old is None:
            fields = _pool_fields(_EMPTY_POOL, spec)
            changes.append(Change(action="create", kind="pool", pool=spec.name, fields=fields))
            changes.extend(_policy_changes(spec.name, [], spec.policies, prune))
            continue
        if fields := _pool_fields(old, spec):
            changes.append(Change(action="update", kind="pool", pool=spec.name, fields=fields))
        changes.extend(_policy_changes(spec.name, old.policies, spec.policies, prune))
    if prune:
        for old in current.pools:
            if old.name in wanted:
                continue
            changes.extend(_policy_changes(old.name, old.policies, [], prune=True))
            changes.append(Change(action="delete", kind="pool", pool=old.name))
    return changes


def merge_map(
    fields: Iterable[FieldChange],
    prefix: str,
    *,
    only: Literal["all", "lowered", "raised"] = "all",
) -> dict[str, int]:
    """The ``prefix.key`` changes as an engine merge map (0 removes a key): all of them, or only
    those whose value went down (``lowered``) or up (``raised``)."""
    out: dict[str, int] = {}
    for f in fields:
        if f.field.startswith(prefix + "."):
            old, new = int(f.old or 0), int(f.new or 0)
            if only == "all" or (new < old if only == "lowered" else new > old):
                out[f.field[len(prefix) + 1 :]] = new
    return out


def changed(fields: Iterable[FieldChange], name: str) -> bool:
    """Whether field ``name`` changed (its new value may be None: ``starvation_seconds``)."""
    return any(f.field == name for f in fields)


def new_value(fields: Iterable[FieldChange], name: str) -> object | None:
    """The new value of field ``name``, None when it did not change."""
    return next((f.new for f in fields if f.field == name), None)


def new_text(fields: Iterable[FieldChange], name: str) -> str | None:
    """:func:`new_value` for a text field (None unless it changed to a string)."""
    value = new_value(fields, name)
    return value if isinstance(value, str) else None
