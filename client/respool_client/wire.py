"""The wire vocabulary of the respool HTTP API: one definition, shared by server and clients.

The server encodes its answers with these Structs and decodes request bodies with them; the
Python client and the CLI decode answers with them. Statuses are a closed set (a CHECK in SQL);
``Request.reason`` stays a plain string on the wire so that a newer server's new reason code
does not break an older client, and :data:`REASONS` lists the codes this version knows
(``tests/client/test_wire_agrees_with_sql.py`` proves both lists agree with the database).

Request bodies carry their constraints as msgspec ``Meta``:

* integer bounds (``ge``/``le``) are enforced when the server decodes a body;
* the rules the engine enforces itself, naming the offending key (``capacity.gpu``), are only
  *declared*, in ``Meta(extra_json_schema={"extra": {...}})``: Litestar copies that ``extra``
  mapping into the OpenAPI document (keys are ``litestar.openapi.spec.Schema`` attribute
  names; nested schemas are plain JSON Schema, camelCase), so clients and fuzzers know them
  without msgspec enforcing them a second time.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

import msgspec
from msgspec import UNSET, Meta, UnsetType

__all__ = [
    "REASONS",
    "STATUSES",
    "TERMINAL",
    "Created",
    "NodeAllocation",
    "Node",
    "NodeCreate",
    "NodeState",
    "NodeUpdate",
    "Placement",
    "PlacementMode",
    "Slice",
    "SliceOveruse",
    "AgentHeartbeat",
    "AgentHeartbeatAnswer",
    "AgentJobs",
    "ErrorBody",
    "Eta",
    "Job",
    "JobClaim",
    "JobClaimed",
    "JobLogChunk",
    "JobLogs",
    "JobLogWrite",
    "JobRelease",
    "JobSpec",
    "Event",
    "PolicyCreate",
    "PolicyUpdate",
    "PolicyWindow",
    "Policy",
    "Pool",
    "PoolCreate",
    "PoolUpdate",
    "Rate",
    "RateChange",
    "RateSpec",
    "Ordering",
    "Queueing",
    "Readiness",
    "Reason",
    "Request",
    "RequestBatch",
    "RequestBatchCreate",
    "RequestCreate",
    "RequestHeartbeat",
    "RequestPage",
    "RequestTerminate",
    "ResourceSettings",
    "Status",
    "Victim",
    "WhatIf",
]

# --- statuses and reason codes ---------------------------------------------------------------

Status = Literal[
    "queued", "allocated", "preempting", "released", "preempted", "expired", "cancelled", "rejected"
]
STATUSES: tuple[Status, ...] = get_args(Status)
TERMINAL: frozenset[str] = frozenset({"released", "rejected", "cancelled", "expired", "preempted"})
# Statuses in which a request holds its units.
HOLDING: frozenset[str] = frozenset({"allocated", "preempting"})

Reason = Literal[
    # rejected at creation, or later when it can never fit (docs/admission.md)
    "no_policy",
    "pool_missing_key",
    "exceeds_capacity",
    "exceeds_limit",
    "exceeds_reserved",
    "no_fitting_node",  # a pool with nodes: no node matching the selector could ever hold it
    # cancelled
    "cancelled",
    "released_while_queued",
    "pool_deleted",
    "policy_deleted",
    "abandoned",  # a queued request whose queue lease lapsed (docs/api.md)
    # expired
    "lease_expired",
    "max_seconds",
    # preempting / preempted (docs/preemption.md), and queued again for the next attempt
    "reclaim",
    "priority",
    "capacity_shrink",
    "limit_shrink",
    "grace_expired",
    "node_drain",  # its node is draining (docs/placement.md)
    "node_removed",  # its node was deleted or moved to another pool with force
    "terminated",  # an admin terminated it (docs/preemption.md)
    "over_slice",  # it used more than its slice and its pool terminates that (docs/placement.md)
    "retry",
    # jobs (docs/jobs.md): queued again after a lease lapsed / never claimed on a lost node;
    # released by a restarted agent whose job's processes were gone
    "expired",
    "unclaimed",
    "agent_restarted",
]
REASONS: frozenset[str] = frozenset(get_args(Reason))

Queueing = Literal["best_effort", "strict"]
Ordering = Literal["fifo", "fair"]
PlacementMode = Literal["pack", "spread"]
NodeState = Literal["active", "cordoned", "draining"]
# How slices of a shared device are kept apart (docs/placement.md, "Sharing a GPU")
SharingMode = Literal["mps", "time-slicing"]
# What a pool does about use above a slice of a shared device (docs/placement.md)
SliceOveruse = Literal["report", "terminate"]

# --- answers ---------------------------------------------------------------------------------


class Rate(msgspec.Struct, frozen=True):
    """A rate key of a pool (docs/rates.md): ``amount`` units per sliding window of
    ``per_seconds``; ``used`` is the sum of the charges inside the window now."""

    amount: int
    per_seconds: int
    used: int
    next_refill_at: datetime | None = None  # when the oldest charge inside leaves the window
    overrun: int = 0  # units settled above their estimates, over the charges inside the window


class Pool(msgspec.Struct, frozen=True):
    id: UUID
    name: str
    description: str
    queueing: Queueing
    preemption_grace_seconds: int
    capacity: dict[str, int]
    usage: dict[str, int]
    queued: int
    created_at: datetime
    updated_at: datetime
    # starvation guard, fair share (defaults so an older server's answer still decodes)
    starvation_seconds: int | None = 300
    ordering: Ordering = "fifo"
    placement: PlacementMode = "pack"  # pools with nodes (docs/placement.md)
    nodes: int = 0  # how many nodes back the pool; 0: abstract units
    rates: dict[str, Rate] = {}  # rate keys (docs/rates.md), not in capacity
    slice_overuse: SliceOveruse = "report"  # use above a slice (docs/placement.md)


class Slice(msgspec.Struct, frozen=True, omit_defaults=True):
    """The part of one shared device an allocation holds (docs/placement.md, "Sharing a GPU"):
    its memory in MiB and, when one was asked, its compute share in percent."""

    memory_mb: int
    share: int | None = None


class Placement(msgspec.Struct, frozen=True):
    """Where an allocation runs in a pool with nodes: the node, its labels and the device ids
    held per key (docs/placement.md); for a slice of a shared device, ``slices`` (key → device
    id → :class:`Slice`), and ``isolation`` per device key (``exclusive`` for whole devices,
    else the node's sharing mode: ``mps`` or ``time-slicing``)."""

    node: str
    labels: dict[str, str]
    devices: dict[str, list[str]]
    slices: dict[str, dict[str, Slice]] = {}
    isolation: dict[str, str] = {}


class NodeAllocation(msgspec.Struct, frozen=True):
    """A request holding units on a node."""

    # null for a client token whose patterns do not cover the holder's subject (docs/api.md)
    request_id: UUID | None
    subject: str | None
    status: Status
    resources: dict[str, int]  # the units charged on this node
    devices: dict[str, list[str]]
    slices: dict[str, dict[str, Slice]] = {}  # its slices of shared devices


class Node(msgspec.Struct, frozen=True):
    id: UUID
    name: str
    pool: str | None  # null: registered, in no pool
    labels: dict[str, str]
    capacity: dict[str, int]
    devices: dict[str, list[str]]  # per key with named devices, in list order
    state: NodeState
    usage: dict[str, int]  # allocated units per key
    allocations: list[NodeAllocation]
    created_at: datetime
    updated_at: datetime
    # shared devices (docs/placement.md, "Sharing a GPU"), keyed by a device key
    sharing: dict[str, SharingMode] = {}
    device_memory_mb: dict[str, int] = {}
    reserved_memory_mb: dict[str, int] = {}
    # its agent (docs/jobs.md): ready, lost (takes no new jobs), null (never ran one)
    agent: Literal["ready", "lost"] | None = None
    agent_seen_at: datetime | None = None


class Policy(msgspec.Struct, frozen=True):
    id: UUID
    subject: str  # a subject, or a pattern with * covering a team's subjects
    pool: str
    pool_id: UUID
    priority: int
    description: str
    reserved: dict[str, int]  # the share as set; in force only while active
    limit: dict[str, int]
    usage: dict[str, int]
    borrowed: dict[str, int]  # usage above the share in force now
    created_at: datetime
    updated_at: datetime
    # policy shapes (defaults so an older server's answer still decodes)
    priority_lane: bool = False
    windows: list[PolicyWindow] | None = None  # null: always active
    active: bool = True
    next_change: datetime | None = None  # when active flips next; null: never
    covers: list[str] = []  # a pattern: the subjects holding or queued through it now


class Eta(msgspec.Struct, frozen=True):
    """Estimated wait of a queued request from now until its grant (docs/scheduling.md)."""

    p50_seconds: int
    p90_seconds: int


class JobClaimed(msgspec.Struct, frozen=True):
    """Which agent claimed a job's attempt (docs/jobs.md)."""

    node: str | None  # null: the agent of a pool without nodes
    attempt: int
    at: datetime


class Job(msgspec.Struct, frozen=True):
    """A request's job as every reader sees it: the env NAMES only (docs/jobs.md)."""

    command: list[str]
    workdir: str | None = None
    name: str | None = None
    env_keys: list[str] = []
    array_index: int | None = None  # a member of an array batch: RESPOOL_ARRAY_INDEX
    claimed: JobClaimed | None = None
    # The values: only in the answer of POST /v1/requests/{id}/claim, to the claiming agent
    # (absent everywhere else).
    env: dict[str, str] | UnsetType = UNSET


class Request(msgspec.Struct, frozen=True):
    """A resource request (docs/admission.md). ``reason`` is one of :data:`REASONS` or null."""

    id: UUID
    subject: str
    pool: str | None
    pool_id: UUID | None
    policy_id: UUID | None
    resources: dict[str, int]
    preemptible: bool
    priority: int
    status: Status
    reason: str | None
    message: str
    queue_position: int | None
    attempt: int
    max_retries: int
    lease_seconds: int | None
    lease_expires_at: datetime | None
    preempt_deadline: datetime | None
    idempotency_key: str | None
    labels: dict[str, str]
    version: int
    created_at: datetime
    updated_at: datetime
    allocated_at: datetime | None
    finished_at: datetime | None
    # scheduling fields (defaults so an older server's answer still decodes)
    max_seconds: int | None = None
    run_deadline: datetime | None = None
    eta: Eta | None = None
    gang_id: UUID | None = None  # the members of one all_or_nothing batch (a gang)
    node_selector: dict[str, str] = {}  # labels its node must carry (docs/placement.md)
    placement: Placement | None = None  # allocated or preempting in a pool with nodes
    preemption_group: str | None = None  # never preempts an allocation of its own group
    # where it held units the last time, once it no longer does (finished, or queued again for a
    # next attempt); null while it holds (see placement) or when it was never placed on a node
    last_placement: Placement | None = None
    job: Job | None = None  # a request that carries a command (docs/jobs.md)
    exit_code: int | None = None  # what the release of its last run reported

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class Victim(msgspec.Struct, frozen=True):
    """An allocation the reconciler would preempt (``WhatIf.would_preempt``). For a client
    token, ``id`` and ``subject`` are null when the allocation belongs to a subject outside the
    token's patterns (it sees the pool and the resources only)."""

    id: UUID | None
    subject: str | None
    pool: str | None
    resources: dict[str, int]


class WhatIf(Request, frozen=True):
    """``POST /v1/requests?dry_run=true`` (docs/api.md): the request as a create would answer
    it now, never stored, plus the allocations the reconciler's next pass would preempt for it."""

    would_preempt: list[Victim] = []


class Event(msgspec.Struct, frozen=True, rename={"from_status": "from", "to_status": "to"}):
    """One status change of a request (``GET /v1/requests/{id}/events``)."""

    from_status: str | None
    to_status: str
    reason: str | None
    attempt: int
    message: str
    at: datetime
    # an allocation in a pool with nodes: the node and devices it was granted (null otherwise)
    placement: Placement | None = None
    # the request this change happened for (a preemption's beneficiary); null: none, or another
    # subject's request a client token may not read (docs/api.md)
    cause_request_id: UUID | None = None
    cause_subject: str | None = None


class Created(msgspec.Struct, frozen=True):
    """A create_request answer: ``created`` is False for an idempotent replay."""

    created: bool
    request: Request


class RequestPage(msgspec.Struct, kw_only=True):
    """One page of requests, newest first; pass ``next_cursor`` as ``cursor`` for the next."""

    items: list[Request]
    next_cursor: str | None


class ErrorBody(msgspec.Struct):
    """Every error answer: ``{"status_code": int, "detail": str, "field": str | null}``."""

    status_code: int
    detail: str
    field: str | None = None


class Readiness(msgspec.Struct, kw_only=True):
    ready: bool
    database: bool
    schema_current: bool
    listener: bool
    detail: str | None = None
    node: str | None = None  # host:port of the database server that serves (the primary)


# --- request bodies --------------------------------------------------------------------------
# Integers are checked when a body is decoded (the database could not even receive a value
# beyond its column type); the bounds are the engine's (sql/functions). Strings and resource
# maps are validated by the engine, which names the offending key; they are only declared.

# One name per bound and pattern; their SQL twins are the functions of
# sql/functions/005_bounds_and_patterns.sql (respool._max_amount() ...), and
# tests/client/test_wire_agrees_with_sql.py proves both agree.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# The largest amount of one key (capacity, reserved, limit, request): exact in every JSON client
# (below 2^53), and 9,223 of them sum within int64, so no usage or demand sum overflows.
MAX_AMOUNT = 10**15
MAX_KEYS = 64  # keys of one resource map or label map
MAX_SECONDS = 31_536_000  # one year: the longest lease, run cap or starvation guard
MAX_GRACE_SECONDS = 86_400  # one day: the longest preemption grace
MAX_RETRIES = 1000
MAX_BATCH = 1000  # members of one batch create; also the largest page of a request list
MAX_KEY_LENGTH = 200  # characters of an idempotency_key
MAX_DESCRIPTION = 2000  # characters of a pool's or policy's description
KEY_PATTERN = "^[a-z][a-z0-9_]{0,62}$"
POOL_NAME_PATTERN = "^[a-z0-9][a-z0-9._-]{0,62}$"
SUBJECT_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$"
NODE_NAME_PATTERN = POOL_NAME_PATTERN
LABEL_KEY_PATTERN = "^[a-z0-9][a-z0-9._/-]{0,62}$"
# A label value: up to 63 printable characters (no control characters).
LABEL_VALUE_PATTERN = "^[^\\x01-\\x1f\\x7f]{0,63}$"
# A policy's subject: a subject, or a pattern with * (a team quota).
POLICY_SUBJECT_PATTERN = "^[A-Za-z0-9*][A-Za-z0-9_.:/@*-]{0,127}$"
# A preemption group: 1 to 128 printable characters.
GROUP_PATTERN = "^[^\\x01-\\x1f\\x7f]{1,128}$"
HHMM_PATTERN = "^([01][0-9]|2[0-3]):[0-5][0-9]$"  # a window's from / to
MAX_DEVICE_ID = 128  # characters of one device id (a GPU UUID or MIG id fits)
MAX_WINDOWS = 64  # windows of one policy
MAX_RATE_SECONDS = 86_400  # one day: the longest window of a rate key (docs/rates.md)
# settings.memory: group 1 the number, group 2 the unit: K M G T P (powers of 1000) or Ki Mi Gi
# Ti Pi (powers of 1024), each with an optional B (8G = 8GB, 8Gi = 8GiB, as in Kubernetes).
MEMORY_PATTERN = "^\\s*([0-9]+(?:\\.[0-9]+)?)\\s*([KMGTP]i?B?)\\s*$"

Priority = Annotated[int, Meta(ge=-(2**31), le=INT32_MAX)]
GraceSeconds = Annotated[int, Meta(ge=0, le=MAX_GRACE_SECONDS)]
MaxRetries = Annotated[int, Meta(ge=0, le=MAX_RETRIES)]
LeaseSeconds = Annotated[int, Meta(ge=1, le=MAX_SECONDS)]
MaxSeconds = Annotated[int, Meta(ge=1, le=MAX_SECONDS)]
StarvationSeconds = Annotated[int, Meta(ge=0, le=MAX_SECONDS)]
Count = Annotated[int, Meta(ge=0, le=MAX_AMOUNT)]

_NO_NUL = "^[^\\u0000]*$"  # PostgreSQL text cannot hold NUL characters


def _declare(**schema: Any) -> Meta:
    """OpenAPI-only constraints (the engine enforces them); see the module docstring."""
    return Meta(extra_json_schema={"extra": schema})


_AMOUNTS = _declare(
    property_names={"pattern": KEY_PATTERN},
    additional_properties={"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT},
    max_properties=MAX_KEYS,
)
_DESCRIPTION = _declare(max_length=MAX_DESCRIPTION, pattern=_NO_NUL)
Amounts = Annotated[dict[str, int], _AMOUNTS]
PoolName = Annotated[str, _declare(pattern=POOL_NAME_PATTERN)]
Subject = Annotated[str, _declare(pattern=SUBJECT_PATTERN)]
PolicySubject = Annotated[str, _declare(pattern=POLICY_SUBJECT_PATTERN)]
PreemptionGroup = Annotated[str, _declare(pattern=GROUP_PATTERN)]
Description = Annotated[str, _DESCRIPTION]
_LABELS = _declare(
    max_properties=MAX_KEYS,
    property_names={"pattern": LABEL_KEY_PATTERN},
    additional_properties={"type": "string", "pattern": LABEL_VALUE_PATTERN},
)
Labels = Annotated[dict[str, str], _LABELS]
NodeName = Annotated[str, _declare(pattern=NODE_NAME_PATTERN)]
_DEVICES = _declare(
    max_properties=MAX_KEYS,
    property_names={"pattern": KEY_PATTERN},
    additional_properties={
        "type": "array",
        "items": {"type": "string", "minLength": 1, "maxLength": MAX_DEVICE_ID},
    },
)
_SHARING = _declare(
    max_properties=MAX_KEYS,
    property_names={"pattern": KEY_PATTERN},
    additional_properties={"type": "string", "enum": ["mps", "time-slicing"]},
)
_DEVICE_MEMORY = _declare(
    max_properties=MAX_KEYS,
    property_names={"pattern": KEY_PATTERN},
    additional_properties={"type": "integer", "minimum": 1, "maximum": MAX_AMOUNT},
)
_MEMORY = MEMORY_PATTERN


Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


class PolicyWindow(
    msgspec.Struct,
    frozen=True,
    forbid_unknown_fields=True,
    kw_only=True,
    omit_defaults=True,
    rename={"from_": "from"},
):
    """When a policy's reserved share is in force (docs/preemption.md, "Time windows"): weekly
    (``timezone``, ``days``, ``from``, ``to``; ``to`` before ``from`` crosses midnight) or one
    time (``start``, ``end``). The engine checks the fields and names the offending one."""

    timezone: str | None = None  # an IANA name, e.g. Europe/Berlin
    days: list[Weekday] | None = None  # absent: every day
    from_: Annotated[str | None, _declare(pattern=HHMM_PATTERN)] = None
    to: Annotated[str | None, _declare(pattern=HHMM_PATTERN)] = None
    start: datetime | None = None
    end: datetime | None = None


Windows = Annotated[list[PolicyWindow], Meta(max_length=MAX_WINDOWS)]


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class RateSpec(_Body):
    """A rate key of a pool (docs/rates.md): ``amount`` units per sliding window of
    ``per_seconds`` seconds."""

    amount: Annotated[int, Meta(ge=1, le=MAX_AMOUNT)]
    per_seconds: Annotated[int, Meta(ge=1, le=MAX_RATE_SECONDS)]


class RateChange(_Body):
    """A change of a rate key in a pool update: the fields sent replace, the others stay."""

    amount: Annotated[int, Meta(ge=1, le=MAX_AMOUNT)] | UnsetType = UNSET
    per_seconds: Annotated[int, Meta(ge=1, le=MAX_RATE_SECONDS)] | UnsetType = UNSET


_RATES = _declare(property_names={"pattern": KEY_PATTERN}, max_properties=MAX_KEYS)


class PoolCreate(_Body):
    name: PoolName
    capacity: Amounts = {}
    description: Description = ""
    queueing: Queueing = "best_effort"
    preemption_grace_seconds: GraceSeconds = 0
    # null turns the starvation guard off (docs/scheduling.md)
    starvation_seconds: StarvationSeconds | None = 300
    ordering: Ordering = "fifo"
    placement: PlacementMode = "pack"
    # rate keys (docs/rates.md): their units come back with time, not on release
    rates: Annotated[dict[str, RateSpec], _RATES] = {}
    # use above a slice of a shared device: an event (report), or also the end of the holding
    slice_overuse: SliceOveruse = "report"


class PoolUpdate(_Body):
    """Absent fields stay as they are; ``capacity`` merges (0 removes a key); ``rates`` merge
    (null removes a rate key)."""

    capacity: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET
    description: Annotated[str | UnsetType, _DESCRIPTION] = UNSET
    queueing: Queueing | UnsetType = UNSET
    preemption_grace_seconds: GraceSeconds | UnsetType = UNSET
    starvation_seconds: StarvationSeconds | None | UnsetType = UNSET  # null: guard off
    ordering: Ordering | UnsetType = UNSET
    placement: PlacementMode | UnsetType = UNSET
    rates: Annotated[dict[str, RateChange | None] | UnsetType, _RATES] = UNSET
    slice_overuse: SliceOveruse | UnsetType = UNSET


class PolicyCreate(_Body):
    subject: PolicySubject
    pool: Annotated[str, _declare(min_length=1, pattern=_NO_NUL)]
    priority: Priority = 0
    reserved: Amounts = {}
    limit: Amounts = {}
    description: Description = ""
    priority_lane: bool = False
    windows: Windows | None = None  # null: always active


class PolicyUpdate(_Body):
    """Absent fields stay as they are; ``reserved``/``limit`` merge (0 removes a key)."""

    priority: Priority | UnsetType = UNSET
    reserved: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET
    limit: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET
    description: Annotated[str | UnsetType, _DESCRIPTION] = UNSET
    priority_lane: bool | UnsetType = UNSET
    windows: Windows | None | UnsetType = UNSET  # null: always active; a list replaces


class ResourceSettings(_Body):
    """ResourceSettings (docs/admission.md); the engine turns them into resources
    (``build_resources``).

    ``cpu_count`` travels as a JSON number with its decimal text preserved: the server decodes
    it as a Decimal from the number as written; a caller may pass an int, a float (sent as its
    shortest repr), a numeric string or a Decimal (``"0.25"``, ``Decimal("0.25")`` → ``0.25``).
    """

    gpu_count: Count | UnsetType = UNSET
    cpu_count: Annotated[
        Decimal | UnsetType,
        _declare(one_of=[{"type": "number", "minimum": 0, "maximum": MAX_AMOUNT // 1000}]),
    ] = UNSET
    memory: Annotated[str | UnsetType, _declare(pattern=_MEMORY)] = UNSET
    pool_resources: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET
    # node_selector["gpu-type"] / ["gpu-class"] (docs/placement.md)
    gpu_type: Annotated[str | UnsetType, _declare(pattern=LABEL_VALUE_PATTERN)] = UNSET
    gpu_class: Annotated[str | UnsetType, _declare(pattern=LABEL_VALUE_PATTERN)] = UNSET

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:  # a caller's None means "not set"
            if getattr(self, name) is None:
                setattr(self, name, UNSET)
        if self.cpu_count is not UNSET:
            # msgspec also takes "NaN" or "Infinity" (as strings) for a Decimal; JSON has no
            # such number, and the engine must not receive one.
            self.cpu_count = _as_decimal(self.cpu_count)

    def to_json(self) -> dict[str, Any]:
        """The fields that are set, as a JSON-ready mapping (``cpu_count`` a Decimal)."""
        out: dict[str, Any] = msgspec.structs.asdict(self)
        return {k: v for k, v in out.items() if v is not UNSET and v is not None}


def _as_decimal(value: object) -> Decimal:
    if isinstance(value, bool):
        raise TypeError("settings.cpu_count must be a number")
    if isinstance(value, Decimal):
        d = value
    elif isinstance(value, int | float):
        d = Decimal(repr(value))
    elif isinstance(value, str):
        try:
            d = Decimal(value.strip())
        except InvalidOperation:
            raise ValueError(f"settings.cpu_count: not a number: {value!r}") from None
    else:
        raise TypeError("settings.cpu_count must be a number")
    if not d.is_finite():
        raise ValueError("settings.cpu_count must be a finite number")
    return d


_ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class JobSpec(_Body):
    """The ``job`` of a create body (docs/jobs.md): run ``command`` (an argv, no shell) on
    the granted node, by its agent, with ``env`` added to the grant's environment."""

    command: Annotated[
        list[str],
        Meta(min_length=1, max_length=256),
        _declare(items={"minLength": 1, "pattern": _NO_NUL}),
    ]
    env: Annotated[
        dict[str, str] | None,
        _declare(
            max_properties=128,
            property_names={"pattern": _ENV_NAME},
            additional_properties={"type": "string", "pattern": _NO_NUL},
        ),
    ] = None
    workdir: Annotated[str | None, _declare(min_length=1, max_length=4096, pattern=_NO_NUL)] = None
    name: Annotated[str | None, _declare(min_length=1, max_length=128, pattern=_NO_NUL)] = None


class RequestCreate(_Body):
    """A create body (``POST /v1/requests``, and each batch member). The server sends it to
    the engine as the client wrote it; the engine checks it and fills the defaults declared
    here (``respool._create_body``; tests/engine/test_create_defaults.py proves they agree)."""

    subject: Subject
    pool: Annotated[str | None, _declare(pattern=_NO_NUL)] = None
    resources: Annotated[dict[str, int] | None, _AMOUNTS] = None
    settings: ResourceSettings | None = None
    preemptible: bool = True
    max_retries: MaxRetries = 0
    max_seconds: MaxSeconds | None = None  # a hard runtime cap (docs/scheduling.md)
    # Absent: the server's default lease (RESPOOL_DEFAULT_LEASE_SECONDS); explicit null: none.
    lease_seconds: LeaseSeconds | None | UnsetType = UNSET
    idempotency_key: Annotated[
        str | None, _declare(min_length=1, max_length=MAX_KEY_LENGTH, pattern=_NO_NUL)
    ] = None
    labels: Annotated[
        dict[str, str] | None,
        _declare(
            max_properties=MAX_KEYS,
            property_names={"minLength": 1, "maxLength": 128, "pattern": _NO_NUL},
            additional_properties={"type": "string", "maxLength": 1024, "pattern": _NO_NUL},
        ),
    ] = None
    # Labels its node must carry, all of them (docs/placement.md); "node" is the node's name.
    node_selector: Annotated[dict[str, str] | None, _LABELS] = None
    # Requests of one group never preempt each other (docs/preemption.md).
    preemption_group: PreemptionGroup | None = None
    job: JobSpec | None = None  # a job: the node's agent runs it (docs/jobs.md)


class RequestTerminate(_Body):
    """``POST /v1/requests/{id}/terminate`` (admin; docs/preemption.md, "Terminate")."""

    force: bool = False
    reason: Annotated[str, _declare(max_length=MAX_DESCRIPTION, pattern=_NO_NUL)] = ""


# A heartbeat's usage: MiB used per <K>_memory_mb key (the memory of a slice of device key K).
USAGE_KEY_PATTERN = "^[a-z][a-z0-9_]*_memory_mb$"


class RequestHeartbeat(_Body):
    """Optional body of ``POST /v1/requests/{id}/heartbeat``: ``usage``, what the holder of a
    slice of a shared device uses now, ``{"gpu_memory_mb": 18000}`` (docs/placement.md,
    "Sharing a GPU"). The engine names a bad key or amount (``usage.gpu_memory_mb``)."""

    usage: Annotated[
        dict[str, int] | None,
        _declare(
            max_properties=MAX_KEYS,
            property_names={"pattern": USAGE_KEY_PATTERN, "maxLength": 63},
            additional_properties={"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT},
        ),
    ] = None


class RequestBatchCreate(_Body):
    """``POST /v1/requests/batch`` (docs/api.md): 1 to 1,000 create bodies, one transaction."""

    members: Annotated[list[RequestCreate], Meta(min_length=1, max_length=MAX_BATCH)]
    # A gang (docs/scheduling.md): one subject, pool, preemptible and max_retries; granted all
    # or none.
    all_or_nothing: bool = False
    # A gang with every member on a different node (docs/placement.md); needs all_or_nothing.
    distinct_nodes: bool = False
    # Jobs (docs/jobs.md): member i gets job.array_index i and RESPOOL_ARRAY_INDEX=i; every
    # member must carry a job.
    array: bool = False


class RequestBatch(msgspec.Struct, kw_only=True):
    """The answer of a batch create: the members' requests, in member order."""

    items: list[Request]


class NodeCreate(_Body):
    """``POST /v1/nodes`` (docs/placement.md). A key listed in ``devices`` has as many units as
    ids (``capacity`` may leave it out, or must agree)."""

    name: NodeName
    pool: Annotated[str | None, _declare(pattern=_NO_NUL)] = None
    labels: Labels = {}
    capacity: Amounts = {}
    devices: Annotated[dict[str, list[str]], _DEVICES] = {}
    state: NodeState = "active"
    # a device key whose devices may be sliced, each device's memory, what each keeps back
    sharing: Annotated[dict[str, str], _SHARING] = {}
    device_memory_mb: Annotated[dict[str, int], _DEVICE_MEMORY] = {}
    reserved_memory_mb: Annotated[dict[str, int], _AMOUNTS] = {}


class NodeUpdate(_Body):
    """``PATCH /v1/nodes/{name}``: absent fields stay. ``labels`` merge (a null value removes
    the label); ``capacity`` merges (0 removes a key); ``devices`` replace the list of each key
    given (null: the key's units become anonymous); ``pool`` moves the node (null: out of any
    pool; refused while it holds allocations unless ``?force=true``)."""

    pool: Annotated[str | None | UnsetType, _declare(pattern=_NO_NUL)] = UNSET
    labels: Annotated[dict[str, str | None] | UnsetType, _LABELS] = UNSET
    capacity: Annotated[dict[str, int] | UnsetType, _AMOUNTS] = UNSET
    devices: Annotated[dict[str, list[str] | None] | UnsetType, _DEVICES] = UNSET
    state: NodeState | UnsetType = UNSET
    # merge per key; null removes it (sharing null: whole devices only)
    sharing: Annotated[dict[str, str | None] | UnsetType, _SHARING] = UNSET
    device_memory_mb: Annotated[dict[str, int | None] | UnsetType, _DEVICE_MEMORY] = UNSET
    reserved_memory_mb: Annotated[dict[str, int | None] | UnsetType, _AMOUNTS] = UNSET


# --- jobs and agents (docs/jobs.md) -----------------------------------------------------------


class AgentHeartbeat(_Body):
    """``POST /v1/agent/heartbeat``: the agent is alive and heartbeats every interval."""

    interval_seconds: Annotated[int, Meta(ge=1, le=300)]


class AgentHeartbeatAnswer(msgspec.Struct, frozen=True):
    node: str | None  # null: an agent of a pool without nodes
    pool: str | None


class AgentJobs(msgspec.Struct, frozen=True):
    """``GET /v1/agent/jobs``: jobs for the calling agent's node, oldest grant first."""

    items: list[Request]


class JobClaim(_Body):
    """``POST /v1/requests/{id}/claim``: the attempt the agent runs (one claim per attempt)."""

    attempt: Annotated[int, Meta(ge=1, le=INT32_MAX)]


class JobRelease(_Body):
    """Optional body of ``POST /v1/requests/{id}/release``: what a job's run reported, and
    the units of rate keys really used (``used``: the settlement, docs/rates.md)."""

    exit_code: Annotated[int, Meta(ge=-(2**31), le=INT32_MAX)] | None = None
    reason: Literal["agent_restarted"] | None = None
    used: Annotated[dict[str, int] | None, _AMOUNTS] = None


class JobLogWrite(_Body):
    """``POST /v1/requests/{id}/logs`` (agent only): one output chunk of an attempt."""

    attempt: Annotated[int, Meta(ge=1, le=INT32_MAX)]
    seq: Annotated[int, Meta(ge=0, le=INT32_MAX)]
    stream: Literal["stdout", "stderr"]
    data: Annotated[str, _declare(pattern=_NO_NUL)]


class JobLogChunk(msgspec.Struct, frozen=True):
    seq: int
    stream: Literal["stdout", "stderr"]
    data: str


class JobLogs(msgspec.Struct, frozen=True):
    """``GET /v1/requests/{id}/logs``: an attempt's stored output after a seq."""

    attempt: int
    chunks: list[JobLogChunk]
    next: int  # the last seq stored: pass it as ``after`` to read on
    truncated: bool  # bytes were dropped between head and tail (a marker line says how many)
    done: bool  # the attempt has ended: nothing more will come
