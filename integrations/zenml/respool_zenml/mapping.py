"""ZenML resource requests ⇄ respool requests: the pure part of the mapping (no ZenML import).

=============================  ==============================================================
ZenML                          respool
=============================  ==============================================================
``component_ids[0]``           subject ``<component type>:<component name>``
demand ``kind="gpu"``          ``gpu`` (with a ``class``: ``gpu_<class>``)
demand ``kind="cpu"``          ``mcpu`` (unit ``CPU`` × 1000, unit ``mCPU`` as is)
demand ``kind="memory"``       ``memory_mb`` (``ceil(bytes / 1_000_000)``)
demand ``resource="x"``        custom key ``x`` (a demand with only ``kind="x"``: ``x`` too)
``reclaim_tolerance: none``    ``preemptible: false`` (``coordinated``/``any``: ``true``)
``step_run_id``                ``idempotency_key``
=============================  ==============================================================
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

KEY = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
SUBJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$")

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
    """A ZenML demand that respool cannot express (selectors, unknown units, bad names)."""


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
    """One demand as one respool ``(key, amount)``."""
    if demand.resource_selector or demand.class_selector:
        raise UnsupportedDemand(
            "resource_selector and class_selector are not supported by respool: name the"
            " resource (ResourceSettings(resources={'key': n})) or use gpu_count/cpu_count/memory"
        )
    quantity = int(demand.quantity)
    if demand.resource:
        if demand.class_name:
            raise UnsupportedDemand(f"resource {demand.resource!r}: a class is only read for gpu")
        return _key(demand.resource, "resource"), quantity
    kind = demand.kind
    if kind == "gpu":
        if demand.class_name:
            cls = re.sub(r"[^a-z0-9_]", "_", demand.class_name.lower())
            return _key(f"gpu_{cls}", "gpu class"), quantity
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
    raise UnsupportedDemand("a demand needs a resource name or a kind")


def demands_to_resources(demands: Iterable[Demand]) -> dict[str, int]:
    """The respool ``resources`` map of a ZenML request; amounts of the same key add up."""
    resources: dict[str, int] = {}
    for demand in demands:
        key, amount = demand_to_resource(demand)
        if key == "step_run":
            raise UnsupportedDemand("step_run is added by respool to every request")
        resources[key] = resources.get(key, 0) + amount
    return {k: v for k, v in resources.items() if v > 0}


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
