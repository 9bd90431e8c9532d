"""Request bodies and answers of the HTTP API (msgspec Structs; unknown fields are refused)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

import msgspec
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import KwargDefinition
from msgspec import UNSET, Meta, UnsetType

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

# --- constraints -----------------------------------------------------------------------------
# Integers are checked here (the database could not even receive a value beyond its column
# type); the bounds are the engine's (sql/functions). Strings and resource maps are validated by
# the engine, which names the offending key (``capacity.gpu``); the API only declares those rules
# in its OpenAPI document (``_declare``), so clients and fuzzers know them.

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

Priority = Annotated[int, Meta(ge=-(2**31), le=INT32_MAX)]
GraceSeconds = Annotated[int, Meta(ge=0, le=86_400)]
MaxRetries = Annotated[int, Meta(ge=0, le=1000)]
LeaseSeconds = Annotated[int, Meta(ge=1, le=31_536_000)]
Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]

_NO_NUL = "^[^\\u0000]*$"  # PostgreSQL text cannot hold NUL characters


def _declare(**schema: Any) -> KwargDefinition:
    """OpenAPI-only constraints (the engine enforces them)."""
    return KwargDefinition(schema_extra=schema)


_AMOUNTS = _declare(
    property_names=Schema(pattern="^[a-z][a-z0-9_]{0,62}$"),
    additional_properties=Schema(type=OpenAPIType.INTEGER, minimum=0, maximum=INT64_MAX),
    max_properties=64,
)
Amounts = Annotated[dict[str, int], _AMOUNTS]
PoolName = Annotated[str, _declare(pattern="^[a-z0-9][a-z0-9._-]{0,62}$")]
Subject = Annotated[str, _declare(pattern="^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$")]
Description = Annotated[str, _declare(max_length=2000, pattern=_NO_NUL)]


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class PoolCreate(_Body):
    name: PoolName
    capacity: Amounts = {}
    description: Description = ""
    queueing: Queueing = "best_effort"
    preemption_grace_seconds: GraceSeconds = 0


class PoolUpdate(_Body):
    """Absent fields stay as they are; ``capacity`` merges (0 removes a key)."""

    capacity: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET
    description: Annotated[str | UnsetType, _declare(max_length=2000, pattern=_NO_NUL)] = UNSET
    queueing: Queueing | UnsetType = UNSET
    preemption_grace_seconds: GraceSeconds | UnsetType = UNSET


class PolicyCreate(_Body):
    subject: Subject
    pool: Annotated[str, _declare(min_length=1, pattern=_NO_NUL)]
    priority: Priority = 0
    reserved: Amounts = {}
    limit: Amounts = {}
    description: Description = ""


class PolicyUpdate(_Body):
    """Absent fields stay as they are; ``reserved``/``limit`` merge (0 removes a key)."""

    priority: Priority | UnsetType = UNSET
    reserved: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET
    limit: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET
    description: Annotated[str | UnsetType, _declare(max_length=2000, pattern=_NO_NUL)] = UNSET


class ResourceSettings(_Body):
    """SPEC §1 ResourceSettings; converted to resources by the engine (build_resources)."""

    gpu_count: Count | UnsetType = UNSET
    # Decoded as a Decimal from the JSON number as written, and sent to SQL as that number.
    cpu_count: Annotated[
        Decimal | UnsetType, _declare(one_of=[Schema(type=OpenAPIType.NUMBER, minimum=0)])
    ] = UNSET
    memory: Annotated[
        str | UnsetType,
        _declare(pattern="^\\s*[0-9]+(\\.[0-9]+)?\\s*(KB|MB|GB|TB|PB|KiB|MiB|GiB|TiB|PiB)\\s*$"),
    ] = UNSET
    pool_resources: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET

    def __post_init__(self) -> None:
        # msgspec also takes "NaN" or "Infinity" (as strings) for a Decimal; JSON has no such
        # number, and the engine must not receive one.
        if isinstance(self.cpu_count, Decimal) and not self.cpu_count.is_finite():
            raise ValueError("settings.cpu_count must be a finite number")


class RequestCreate(_Body):
    subject: Subject
    pool: Annotated[str | None, _declare(pattern=_NO_NUL)] = None
    resources: Annotated[dict[str, int] | None, _AMOUNTS] = None
    settings: ResourceSettings | None = None
    preemptible: bool = True
    max_retries: MaxRetries = 0
    # Absent: RESPOOL_DEFAULT_LEASE_SECONDS; explicit null: no lease.
    lease_seconds: LeaseSeconds | None | UnsetType = UNSET
    idempotency_key: Annotated[
        str | None, _declare(min_length=1, max_length=200, pattern=_NO_NUL)
    ] = None
    labels: Annotated[
        dict[str, str] | None,
        _declare(
            max_properties=64,
            property_names=Schema(min_length=1, max_length=128, pattern=_NO_NUL),
            additional_properties=Schema(type=OpenAPIType.STRING, max_length=1024, pattern=_NO_NUL),
        ),
    ] = None


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
