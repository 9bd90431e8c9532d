"""Request bodies and answers of the HTTP API (msgspec Structs; unknown fields are refused)."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from app.db.queries import Request

__all__ = [
    "PolicyCreate",
    "PolicyUpdate",
    "PoolCreate",
    "PoolUpdate",
    "Readiness",
    "RequestCreate",
    "RequestPage",
    "ResourceSettings",
]

Queueing = Literal["best_effort", "strict"]


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class PoolCreate(_Body):
    name: str
    capacity: dict[str, int] = {}
    description: str = ""
    queueing: Queueing = "best_effort"
    preemption_grace_seconds: int = 0


class PoolUpdate(_Body):
    """Absent fields stay as they are; ``capacity`` merges (0 removes a key)."""

    capacity: dict[str, int] | UnsetType = UNSET
    description: str | UnsetType = UNSET
    queueing: Queueing | UnsetType = UNSET
    preemption_grace_seconds: int | UnsetType = UNSET


class PolicyCreate(_Body):
    subject: str
    pool: str
    priority: int = 0
    reserved: dict[str, int] = {}
    limit: dict[str, int] = {}
    description: str = ""


class PolicyUpdate(_Body):
    """Absent fields stay as they are; ``reserved``/``limit`` merge (0 removes a key)."""

    priority: int | UnsetType = UNSET
    reserved: dict[str, int] | UnsetType = UNSET
    limit: dict[str, int] | UnsetType = UNSET
    description: str | UnsetType = UNSET


class ResourceSettings(_Body):
    """SPEC §1 ResourceSettings; converted to resources by the engine (build_resources)."""

    gpu_count: int | UnsetType = UNSET
    # Decoded as a Decimal from the JSON number as written, and sent to SQL as that number.
    cpu_count: Decimal | UnsetType = UNSET
    memory: str | UnsetType = UNSET
    pool_resources: dict[str, int] | UnsetType = UNSET


class RequestCreate(_Body):
    subject: str
    pool: str | None = None
    resources: dict[str, int] | None = None
    settings: ResourceSettings | None = None
    preemptible: bool = True
    max_retries: int = 0
    # Absent: RESPOOL_DEFAULT_LEASE_SECONDS; explicit null: no lease.
    lease_seconds: int | None | UnsetType = UNSET
    idempotency_key: str | None = None
    labels: dict[str, str] | None = None


class RequestPage(msgspec.Struct, kw_only=True):
    """One page of requests, newest first; pass ``next_cursor`` as ``cursor`` for the next."""

    items: list[Request]
    next_cursor: str | None


class Readiness(msgspec.Struct, kw_only=True):
    ready: bool
    database: bool
    schema_current: bool
    listener: bool
    detail: str | None = None
