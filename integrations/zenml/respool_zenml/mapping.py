"""ZenML resource requests ⇄ respool requests: the pure part of the mapping (no ZenML import).

=============================  ==============================================================
ZenML                          respool
=============================  ==============================================================
``component_ids[0]``           subject ``<component type>:<component name>``
demand ``kind="gpu"``          ``gpu``; with a ``class`` (``gpu_class``):
                               ``node_selector["gpu-class"] = <class>``
demand ``kind="cpu"``          ``mcpu`` (unit ``CPU`` × 1000, unit ``mCPU`` as is)
demand ``kind="memory"``       ``memory_mb`` (``ceil(bytes / 1_000_000)``)
demand ``resource="x"``        custom key ``x`` (a demand with only ``kind="x"``: ``x`` too)
``class_selector``,            ``node_selector`` pairs: each key is a node label of the same
``resource_selector``          name, each value its text (``True`` → ``"true"``, ``80`` →
                               ``"80"``); flat equality only
``reclaim_tolerance: none``    ``preemptible: false`` (``coordinated``/``any``: ``true``)
``step_run_id``                ``idempotency_key``
the step's pipeline run id     ``preemption_group``: the steps of one run never preempt each
                               other (as ZenML's own pools do)
=============================  ==============================================================

A respool request is placed on one node, so the selectors of all of a request's demands make
one ``node_selector``: two demands asking one label for different values are refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

KEY = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
SUBJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$")
# A node label (docs/placement.md): its key, and a value of up to 63 printable characters.
LABEL_KEY = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,62}$")
LABEL_VALUE = re.compile(r"^[^\x00-\x1f\x7f]{0,63}$")
# A preemption group: 1 to 128 printable characters.
GROUP = re.compile(r"^[^\x00-\x1f\x7f]{1,128}$")
# The node label a gpu demand's class (ResourceSettings.gpu_class) selects.
GPU_CLASS_LABEL = "gpu-class"

# ZenML's ByteUnit values and what they are in bytes.
BYTE_UNITS: Mapping[str, int] = {
    "B": 1,
    "KB": 10**3,
    "KiB": 1 << 10,
    "MB": 10**6,
    "MiB": 1 << 20,
    "GB": 10**9,
    "GiB": 1 << 30,
    "TB": 10**12,
    "TiB": 1 << 40,
    "PB": 10**15,
    "PiB": 1 << 50,
}

# respool status → ZenML ResourceRequestStatus value. ``rejected`` with reason ``no_policy``
# is special-cased in :func:`zenml_status`.
STATUS: Mapping[str, str] = {
    "queued": "pending",
    "allocated": "allocated",
    "preempting": "preempting",
    "preempted": "preempted",
    "released": "released",
    "expired": "expired",
    "cancelled": "cancelled",
    "rejected": "rejected",
}

# ZenML status → the respool statuses it stands for (list filters).
RESPOOL_STATUSES: Mapping[str, tuple[str, ...]] = {
    "pending": ("queued",),
    "allocated": ("allocated",),
    "preempting": ("preempting",),
    "preempted": ("preempted",),
    "released": ("released",),
    "expired": ("expired",),
    "cancelled": ("cancelled",),
    "rejected": ("rejected",),
    "no_matching_pool": ("rejected",),
}


class UnsupportedDemand(ValueError):
    """A ZenML demand that respool cannot express (non-flat selectors, unknown units, bad
    names)."""


class Demand(Protocol):
    """What is read of ZenML's ``ResourceRequestDemand``."""

    resource: str | None
    kind: str | None
    quantity: int
    unit: str | None
    class_name: str | None
    resource_selector: dict[str, Any] | None
    class_selector: dict[str, Any] | None


def subject_for(component_type: str, component_name: str) -> str:
    """The respool subject of a ZenML stack component, e.g. ``orchestrator:prod-stack``."""
    subject = f"{component_type}:{component_name}"
    if not SUBJECT.match(subject):
        raise UnsupportedDemand(
            f"stack component {component_name!r} ({component_type}) cannot be a respool subject:"
            " `type:name` must match ^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$; rename the component"
        )
    return subject


def _key(name: str, what: str) -> str:
    if not KEY.match(name):
        raise UnsupportedDemand(
            f"{what} {name!r} is not a respool resource key (^[a-z][a-z0-9_]{{0,62}}$)"
        )
    return name


def demand_to_resource(demand: Demand) -> tuple[str, int]:
    """One demand as one respool ``(key, amount)``; where it must run is
    :func:`demand_to_selector`'s."""
    quantity = int(demand.quantity)
    if demand.resource:
        if demand.class_name:
            raise UnsupportedDemand(f"resource {demand.resource!r}: a class is only read for gpu")
        return _key(demand.resource, "resource"), quantity
    kind = demand.kind
    if kind == "gpu":
        return "gpu", quantity
    if kind == "cpu":
        unit = demand.unit or "CPU"
        if unit == "CPU":
            return "mcpu", quantity * 1000
        if unit == "mCPU":
            return "mcpu", quantity
        raise UnsupportedDemand(f"cpu unit {unit!r} (expected CPU or mCPU)")
    if kind == "memory":
        unit = demand.unit or "B"
        if unit not in BYTE_UNITS:
            raise UnsupportedDemand(f"memory unit {unit!r} (expected one of {sorted(BYTE_UNITS)})")
        return "memory_mb", math.ceil(quantity * BYTE_UNITS[unit] / 1_000_000)
    if kind:
        if demand.unit or demand.class_name:
            raise UnsupportedDemand(f"kind {kind!r}: units and classes are only read for gpu/cpu")
        return _key(kind, "kind"), quantity
    raise UnsupportedDemand(
        "a demand needs a resource name or a kind (respool reads a selector as the labels of "
        "the node, not as a way to find the resource)"
    )


def _label_value(field: str, label: str, value: object) -> str:
    """A flat selector value as a label value: a string as is, an int as its digits, a bool as
    ``true``/``false``; anything else (lists, maps, operators, floats, null) is refused."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise UnsupportedDemand(
            f"{field}[{label!r}] = {value!r}: respool selects nodes by equality on labels only;"
            " give a string, int or bool (no lists, operators or nested maps)"
        )
    if not LABEL_VALUE.match(text):
        raise UnsupportedDemand(
            f"{field}[{label!r}]: a node label value has at most 63 printable characters"
        )
    return text


def demand_to_selector(demand: Demand) -> dict[str, str]:
    """The node labels one demand asks for: its gpu class as ``gpu-class``, and its
    ``class_selector`` and ``resource_selector`` pairs as labels of the same name."""
    selector: dict[str, str] = {}

    def add(field: str, label: str, value: object) -> None:
        if not isinstance(label, str) or not LABEL_KEY.match(label):
            raise UnsupportedDemand(
                f"{field}: {label!r} is not a node label name (^[a-z0-9][a-z0-9._/-]{{0,62}}$)"
            )
        text = _label_value(field, label, value)
        if selector.get(label, text) != text:
            raise UnsupportedDemand(
                f"{field}[{label!r}] = {text!r} contradicts {label}={selector[label]!r} of the"
                " same demand"
            )
        selector[label] = text

    if demand.class_name and demand.kind == "gpu" and not demand.resource:
        add("gpu_class", GPU_CLASS_LABEL, demand.class_name)
    for field in ("class_selector", "resource_selector"):
        pairs = getattr(demand, field)
        if pairs is None:
            continue
        if not isinstance(pairs, Mapping):
            raise UnsupportedDemand(f"{field} must be a map of node label to value")
        for label, value in pairs.items():
            add(field, label, value)
    return selector


def demands_to_resources(demands: Iterable[Demand]) -> dict[str, int]:
    """The respool ``resources`` map of a ZenML request; amounts of the same key add up."""
    resources: dict[str, int] = {}
    for demand in demands:
        key, amount = demand_to_resource(demand)
        if key == "step_run":
            raise UnsupportedDemand("step_run is added by respool to every request")
        resources[key] = resources.get(key, 0) + amount
    return {k: v for k, v in resources.items() if v > 0}


def demands_to_node_selector(demands: Iterable[Demand]) -> dict[str, str]:
    """The respool ``node_selector`` of a ZenML request: the labels every demand asks for
    (a request runs on one node, so they must agree)."""
    selector: dict[str, str] = {}
    for demand in demands:
        for label, value in demand_to_selector(demand).items():
            if selector.get(label, value) != value:
                raise UnsupportedDemand(
                    f"two demands ask node label {label!r} for {selector[label]!r} and {value!r}:"
                    " a respool request runs on one node"
                )
            selector[label] = value
    return selector


def preemption_group_for(pipeline_run_id: object | None) -> str | None:
    """The respool ``preemption_group`` of a step of pipeline run ``pipeline_run_id``: the run's
    id, so that a step never preempts a step of its own run (docs/zenml.md); None (no group)
    when the step's run is unknown."""
    if pipeline_run_id is None:
        return None
    group = str(pipeline_run_id)
    if not GROUP.fullmatch(group):
        raise UnsupportedDemand(f"pipeline run id {group!r} cannot be a respool preemption group")
    return group


def candidate_pools(subject: str, policies: Iterable[Mapping[str, Any]]) -> list[str]:
    """The pools a request of ``subject`` without a pool is a candidate in, in the order respool
    tries them (policy priority, highest first, then pool name; docs/admission.md): on each pool
    the subject's own policy, else the pattern policy (``orchestrator:*``) with the longest text
    before its first ``*``. ``policies`` are respool's policy documents (``GET /v1/policies``)."""
    best: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for policy in policies:
        pattern = str(policy.get("subject", ""))
        if pattern == subject:
            rank = 0
        elif "*" in pattern and re.fullmatch(
            ".*".join(re.escape(part) for part in pattern.split("*")), subject, re.DOTALL
        ):
            rank = 1 + 1000 - len(pattern.split("*", 1)[0])
        else:
            continue
        pool = str(policy.get("pool", ""))
        if pool and (pool not in best or rank < best[pool][0]):
            best[pool] = (rank, policy)
    chosen = sorted(best.items(), key=lambda item: (-int(item[1][1].get("priority") or 0), item[0]))
    return [pool for pool, _ in chosen]


def zenml_status(status: str, reason: str | None) -> str:
    """The ZenML ``ResourceRequestStatus`` value of a respool status and reason."""
    if status == "rejected" and reason == "no_policy":
        return "no_matching_pool"
    return STATUS[status]


def status_reason(status: str, reason: str | None, message: str) -> str | None:
    """ZenML's ``status_reason``: respool's reason code and its sentence."""
    if status == "queued":
        return message or None  # e.g. "waiting for gpu: pool 1/1 used, needs 1"
    if reason and message:
        return f"{reason}: {message}"
    return reason or message or None
