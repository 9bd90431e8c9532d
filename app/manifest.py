"""The diff of a manifest (``respool apply``) against the current pools, policies and nodes.

The manifest's types are the client distribution's (:mod:`respool_client.manifest`).
:func:`plan_changes` is pure: it compares the current state with the manifest and returns the
changes, field by field, that make them equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec
from respool_client.manifest import (
    Change,
    FieldChange,
    Manifest,
    NodeSpec,
    PolicySpec,
    PoolSpec,
    node_capacity,
)

__all__ = [
    "changed",
    "merge_map",
    "node_patch",
    "new_text",
    "new_value",
    "plan_changes",
    "rate_changes",
]


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
    "placement",
    "slice_overuse",
)
_POLICY_SCALARS = ("priority", "description")
_EMPTY_POOL = PoolSpec(name="")


def _rate_changes(old: PoolSpec, new: PoolSpec) -> list[FieldChange]:
    """Per rate key (docs/rates.md): ``rates.KEY`` from ``{"amount", "per_seconds"}`` (or
    None: absent) to another."""
    before = {k: msgspec.to_builtins(v) for k, v in old.rates.items()}
    after = {k: msgspec.to_builtins(v) for k, v in new.rates.items()}
    return [
        FieldChange(f"rates.{key}", before.get(key), after.get(key))
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]


def rate_changes(fields: Iterable[FieldChange]) -> dict[str, object]:
    """The ``rates.KEY`` changes as an engine merge (None removes a rate key)."""
    return {f.field[len("rates.") :]: f.new for f in fields if f.field.startswith("rates.")}


def _pool_fields(old: PoolSpec, new: PoolSpec) -> list[FieldChange]:
    return (
        _map_changes("capacity", old.capacity, new.capacity)
        + _rate_changes(old, new)
        + _scalar_changes(old, new, _POOL_SCALARS)
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


def _text_map_changes(
    name: str, old: Mapping[str, object], new: Mapping[str, object]
) -> list[FieldChange]:
    """Per-key changes of a map of labels or device lists (``None``: absent)."""
    return [
        FieldChange(f"{name}.{key}", old.get(key), new.get(key))
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]


_EMPTY_NODE = NodeSpec(name="")


def _node_fields(old: NodeSpec, new: NodeSpec) -> list[FieldChange]:
    return (
        _scalar_changes(old, new, ("pool", "state"))
        + _text_map_changes("labels", old.labels, new.labels)
        + _map_changes("capacity", node_capacity(old), node_capacity(new))
        + _text_map_changes("devices", old.devices, new.devices)
        + _text_map_changes("sharing", old.sharing, new.sharing)
        + _text_map_changes("device_memory_mb", old.device_memory_mb, new.device_memory_mb)
        + _text_map_changes("reserved_memory_mb", old.reserved_memory_mb, new.reserved_memory_mb)
    )


def _node_changes(current: Manifest, desired: Manifest, prune: bool) -> list[Change]:
    """Node creations and updates in manifest order; with ``prune``, deletions of the nodes it
    does not name. None when the manifest leaves nodes alone (``nodes`` null)."""
    if desired.nodes is None:
        return []
    have = {n.name: n for n in current.nodes or []}
    changes: list[Change] = []
    for spec in desired.nodes:
        old = have.get(spec.name)
        pool = spec.pool or ""
        if old is None:
            fields = _node_fields(_EMPTY_NODE, spec)
            changes.append(
                Change(action="create", kind="node", pool=pool, node=spec.name, fields=fields)
            )
        elif fields := _node_fields(old, spec):
            changes.append(
                Change(action="update", kind="node", pool=pool, node=spec.name, fields=fields)
            )
    if prune:
        wanted = {n.name for n in desired.nodes}
        changes.extend(
            Change(action="delete", kind="node", pool=n.pool or "", node=n.name)
            for n in current.nodes or []
            if n.name not in wanted
        )
    return changes


def node_patch(fields: Iterable[FieldChange]) -> dict[str, object]:
    """A node update's changes as an ``update_node`` body: ``pool``/``state`` as they are,
    ``labels`` (null removes), ``capacity`` (0 removes), ``devices`` (null: the key's units
    become anonymous) and the sharing maps (null removes a key) as merges."""
    body: dict[str, object] = {}
    maps: dict[str, dict[str, object]] = {}
    for f in fields:
        head, _, key = f.field.partition(".")
        if not key:
            body[head] = f.new
        elif head == "capacity":
            maps.setdefault(head, {})[key] = 0 if f.new is None else f.new
        else:
            maps.setdefault(head, {})[key] = f.new
    return body | maps


def plan_changes(current: Manifest, desired: Manifest, *, prune: bool = False) -> list[Change]:
    """What turns ``current`` into ``desired``: pools in manifest order, each followed by its
    policies, then nodes; with ``prune``, deletions of pools, policies and (when the manifest
    has ``nodes``) nodes the manifest does not name."""
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
    return changes + _node_changes(current, desired, prune)


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
