"""The ZenML server's resource-pool store, backed by respool over HTTP.

ZenML loads it from ``ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE=
respool_zenml.store.RespoolResourcePoolStore``. It keeps no state of its own: every ZenML
resource request *is* a respool request (same id), and what ZenML needs to show it again
(step run, pipeline run, component, user, project) travels in the respool request's labels.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from zenml.enums import (
    ResourceRequestReclaimTolerance,
    ResourceRequestRuntimeState,
    ResourceRequestStatus,
)
from zenml.exceptions import IllegalOperationError
from zenml.models import (
    Page,
    ResourceRequestFilter,
    ResourceRequestRequest,
    ResourceRequestResponse,
)
from zenml.models.v2.core.resource_request import (
    ResourceRequestDemand,
    ResourceRequestRenewalRequest,
    ResourceRequestResponseBody,
    ResourceRequestResponseMetadata,
    ResourceRequestResponseResources,
)
from zenml.zen_stores.resource_pools.store_interface import ResourcePoolsSQLStoreInterface
from zenml.zen_stores.schemas import (
    PipelineRunSchema,
    ProjectSchema,
    StackComponentSchema,
    StepRunSchema,
    UserSchema,
)

from respool_zenml.mapping import (
    GPU_CLASS_LABEL,
    RESPOOL_STATUSES,
    candidate_pools,
    demands_to_node_selector,
    demands_to_resources,
    preemption_group_for,
    status_reason,
    subject_for,
    zenml_status,
)
from respool_zenml.transport import RespoolApi

if TYPE_CHECKING:
    from zenml.zen_stores.sql_zen_store import Session, SqlZenStore

log = logging.getLogger(__name__)

# Labels the store writes; a respool request without LABEL_STEP_RUN was not made by ZenML and
# is not listed.
LABEL_STEP_RUN = "zenml_step_run_id"
LABEL_RUN = "zenml_pipeline_run_id"
LABEL_COMPONENT = "zenml_component_id"
LABEL_USER = "zenml_user_id"
LABEL_PROJECT = "zenml_project_id"
LABEL_TOLERANCE = "zenml_reclaim_tolerance"

# How many respool requests one ZenML list call reads at most (newest first).
MAX_LISTED = 5000

# What ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE names (docs/zenml.md).
SOURCE = "respool_zenml.store.RespoolResourcePoolStore"


def __getattr__(name: str) -> Any:
    """A name this module does not have, e.g. a misspelt class in
    ``ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE``: the error says which source is meant.

    ZenML's server treats only a module it cannot find as "no resource pools" (one warning, and
    every step then runs unmanaged); any other error stops the server at start-up. A misspelt
    class stops it with this message, rather than letting steps run unmanaged in silence.
    """
    if name.startswith("__"):  # dunder probes (copy, pickle, typing): the plain error
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise AttributeError(
        f"module {__name__!r} has no attribute {name!r}: the respool resource-pool store is"
        f" ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE={SOURCE}"
    )


def _naive_utc(value: str | datetime | None) -> datetime | None:
    """ZenML keeps naive UTC datetimes; respool answers ISO 8601 with an offset."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC).replace(tzinfo=None)
    return dt


def _seconds_until(expires_at: datetime) -> int:
    """Whole seconds from now until a ZenML lease expiry (naive means UTC); at least 1."""
    aware = expires_at if expires_at.tzinfo else expires_at.replace(tzinfo=UTC)
    return max(1, math.ceil((aware - datetime.now(UTC)).total_seconds()))


def _demands(
    resources: dict[str, int], node_selector: dict[str, str] | None = None
) -> list[ResourceRequestDemand]:
    """respool's resources as ZenML demands (the inverse of the mapping, in respool units); the
    gpu demand carries the ``gpu-class`` the request selects as its class."""
    out: list[ResourceRequestDemand] = []
    gpu_class = (node_selector or {}).get(GPU_CLASS_LABEL)
    for key, amount in sorted(resources.items()):
        if key == "step_run" or amount <= 0:
            continue
        if key == "gpu":
            out.append(ResourceRequestDemand(kind="gpu", quantity=amount, class_name=gpu_class))
        elif key == "mcpu":
            out.append(ResourceRequestDemand(kind="cpu", quantity=amount, unit="mCPU"))
        elif key == "memory_mb":
            out.append(ResourceRequestDemand(kind="memory", quantity=amount, unit="MB"))
        else:
            out.append(ResourceRequestDemand(resource=key, quantity=amount))
    return out


def _uuid(value: str | None) -> UUID | None:
    return UUID(value) if value else None


def _plain(value: Any) -> str | None:
    """A ZenML filter value as a plain string (``equals:`` accepted; other operators refused)."""
    if value is None:
        return None
    text = str(getattr(value, "value", value))
    op, sep, rest = text.partition(":")
    if sep and op in {"equals", "eq"}:
        return rest
    if sep and op in {"contains", "startswith", "endswith", "oneof", "gt", "gte", "lt", "lte"}:
        raise ValueError(f"respool's resource request list filters by equality only, not {op!r}")
    return text


class RespoolResourcePoolStore(ResourcePoolsSQLStoreInterface):
    """ZenML resource requests, created, renewed, listed and released in respool.

    Configuration (environment of the ZenML server): ``RESPOOL_URL`` (default
    ``http://127.0.0.1:8080``) and ``RESPOOL_TOKEN`` (an ``admin`` token, or a ``client`` token
    whose subject patterns cover the ZenML components, e.g. ``orchestrator:*``).
    """

    def __init__(self, store: SqlZenStore) -> None:
        super().__init__(store)
        self._api: RespoolApi | None = None
        self._lock = threading.Lock()

    @property
    def api(self) -> RespoolApi:
        with self._lock:
            if self._api is None:
                self._api = RespoolApi()
            return self._api

    # --- creating ------------------------------------------------------------------------

    def create_resource_request(
        self, session: Session, resource_request: ResourceRequestRequest
    ) -> ResourceRequestResponse:
        req = resource_request
        if not req.component_ids or req.step_run_id is None:
            raise ValueError("respool serves step-run resource requests only (component and step)")
        if req.pool_selector:
            raise ValueError("pool_selector is not supported by respool: name the pool or omit it")
        component = session.get(StackComponentSchema, req.component_ids[0])
        if component is None:
            raise KeyError(f"stack component {req.component_ids[0]} not found")
        subject = subject_for(component.type, component.name)
        resources = demands_to_resources(req.demands)
        body: dict[str, Any] = {
            "resources": resources,
            # gpu_class, class_selector and resource_selector: the labels of the node to run on
            "node_selector": demands_to_node_selector(req.demands) or None,
            "preemptible": req.reclaim_tolerance != ResourceRequestReclaimTolerance.NONE,
            "idempotency_key": str(req.step_run_id),
            "labels": self._labels(session, req),
        }
        if req.lease_expires_at:  # without an expiry: left out, so the server's default lease
            body["lease_seconds"] = _seconds_until(req.lease_expires_at)
        if req.pool or req.pool_id:
            body["pool"] = req.pool or str(req.pool_id)
        # The steps of one pipeline run never preempt each other (docs/zenml.md).
        step = session.get(StepRunSchema, req.step_run_id)
        group = preemption_group_for(step.pipeline_run_id if step is not None else None)
        if group is not None:
            body["preemption_group"] = group
        doc = self.api.create_request(subject, **body)
        return self._response(doc)

    def _labels(self, session: Session, req: ResourceRequestRequest) -> dict[str, str]:
        """run, step, project and user by name for people; ids for the store."""
        labels = {
            LABEL_STEP_RUN: str(req.step_run_id),
            LABEL_COMPONENT: str(req.component_ids[0]) if req.component_ids else "",
            LABEL_TOLERANCE: str(req.reclaim_tolerance.value),
        }

        def name_of(label: str, schema: type[Any], row_id: UUID) -> None:
            row = session.get(schema, row_id)
            if row is not None:
                labels[label] = row.name

        if req.user:
            labels[LABEL_USER] = str(req.user)
            name_of("user", UserSchema, req.user)
        step = session.get(StepRunSchema, req.step_run_id)
        if step is not None:
            labels["step"] = step.name
            labels[LABEL_RUN] = str(step.pipeline_run_id)
            labels[LABEL_PROJECT] = str(step.project_id)
            name_of("run", PipelineRunSchema, step.pipeline_run_id)
            name_of("project", ProjectSchema, step.project_id)
        return {k: v[:1024] for k, v in labels.items() if v}

    # --- reading -------------------------------------------------------------------------

    def get_resource_request(
        self, resource_request_id: UUID, hydrate: bool = True
    ) -> ResourceRequestResponse:
        return self._response(self.api.get_request(resource_request_id), pools=self._pool_names())

    def _pool_names(self) -> Callable[[str], str | None]:
        """What ZenML shows as the pool of a request respool has not placed in one pool
        (rejected on several, or waiting in several): its candidate pools, ``gpus, other``, in
        the order respool tries them, from the subject's policies now (read once per call)."""
        policies: list[dict[str, Any]] | None = None

        def names(subject: str) -> str | None:
            nonlocal policies
            if policies is None:
                try:
                    policies = self.api.list_policies()
                except (KeyError, ValueError) as exc:  # e.g. a token that may not read them
                    log.debug("respool policies not readable: %s", exc)
                    policies = []
            return ", ".join(candidate_pools(subject, policies)) or None

        return names

    def list_resource_requests(
        self, filter_model: ResourceRequestFilter, hydrate: bool = False
    ) -> Page[ResourceRequestResponse]:
        f = filter_model
        status = _plain(f.status)
        wanted = {
            LABEL_STEP_RUN: _plain(f.step_run_id),
            LABEL_RUN: _plain(f.pipeline_run_id),
            LABEL_COMPONENT: _plain(f.component_id),
            LABEL_TOLERANCE: _plain(f.reclaim_tolerance),
        }
        user = _plain(f.user)
        project = _plain(f.project)
        pool = _plain(f.pool_id)
        respool_statuses: tuple[str | None, ...] = (None,)
        if status is not None:
            if status not in RESPOOL_STATUSES:
                raise ValueError(f"unknown resource request status {status!r}")
            respool_statuses = RESPOOL_STATUSES[status]
        items: list[ResourceRequestResponse] = []
        pools = self._pool_names()
        for rstatus in respool_statuses:
            for doc in self._scan(status=rstatus, pool=pool):
                labels: dict[str, str] = doc.get("labels") or {}
                if LABEL_STEP_RUN not in labels:
                    continue
                if any(v is not None and labels.get(k) != v for k, v in wanted.items()):
                    continue
                if user is not None and user not in (labels.get(LABEL_USER), labels.get("user")):
                    continue
                if project is not None and project not in (
                    labels.get(LABEL_PROJECT),
                    labels.get("project"),
                ):
                    continue
                response = self._response(doc, pools=pools)
                if status is not None and response.status != status:
                    continue  # rejected vs no_matching_pool
                items.append(response)
        descending = str(f.sort_by).startswith("desc:")
        items.sort(key=lambda r: (r.body.created if r.body else datetime.min, r.id))
        if descending:
            items.reverse()
        size = max(1, int(f.size))
        total = len(items)
        index = max(1, int(f.page))
        return Page[ResourceRequestResponse](
            index=index,
            max_size=size,
            total_pages=math.ceil(total / size),
            total=total,
            items=items[(index - 1) * size : index * size],
        )

    def _scan(self, *, status: str | None, pool: str | None) -> Iterator[dict[str, Any]]:
        cursor: str | None = None
        seen = 0
        while seen < MAX_LISTED:
            items, cursor = self.api.list_requests(
                status=status, pool=pool, limit=1000, cursor=cursor
            )
            yield from items
            seen += len(items)
            if not cursor:
                return

    # --- acting --------------------------------------------------------------------------

    def renew_resource_request(
        self,
        resource_request_id: UUID,
        renewal_request: ResourceRequestRenewalRequest,
    ) -> ResourceRequestResponse:
        """A respool heartbeat with the lease ZenML asks for (queued: the queue lease)."""
        self._check_owner(self.api.get_request(resource_request_id), "renew")
        seconds = _seconds_until(renewal_request.lease_expires_at)
        doc = self.api.heartbeat(resource_request_id, lease_seconds=seconds)
        return self._response(doc, renewal_request.runtime_state)

    def release_resource_request(self, resource_request_id: UUID) -> ResourceRequestResponse:
        self._check_owner(self.api.get_request(resource_request_id), "release")
        return self._response(self.api.release(resource_request_id))

    def release_step_run_resources(self, session: Session, step_run_id: UUID) -> None:
        """End a finished (or retrying) step's request: allocated → released, queued → cancelled.

        Called by ZenML after the step's final status is committed, so an error here cannot
        undo it: a respool outage is logged (with what happens next) instead of raised.
        """
        step = session.get(StepRunSchema, step_run_id)
        request_id = step.resource_request_id if step is not None else None
        if request_id is None:
            return  # no request (unmanaged step), or none was created
        try:
            self.api.release(request_id)
        except KeyError:
            return  # already deleted in respool: nothing holds units
        except Exception as exc:
            log.error(
                "Could not release respool request %s of step run %s: %s. respool ends it when"
                " its lease lapses (no one renews it any more).",
                request_id,
                step_run_id,
                exc,
            )

    def _check_owner(self, doc: dict[str, Any], action: str) -> None:
        """ZenML's endpoints leave ownership to the store: the request's user or an admin."""
        try:
            from zenml.zen_server.utils import get_auth_context

            ctx = get_auth_context()
        except Exception:  # not inside a server request (e.g. a direct store call)
            return
        if ctx is None:
            return
        owner = (doc.get("labels") or {}).get(LABEL_USER)
        user = ctx.user
        if owner and str(user.id) != owner and not user.is_admin:
            raise IllegalOperationError(
                f"user {user.name} may not {action} resource request {doc['id']}: it belongs to"
                " another user"
            )

    # --- answers -------------------------------------------------------------------------

    def _response(
        self,
        doc: dict[str, Any],
        runtime_state: ResourceRequestRuntimeState | None = None,
        *,
        pools: Callable[[str], str | None] | None = None,
    ) -> ResourceRequestResponse:
        labels: dict[str, str] = doc.get("labels") or {}
        status = ResourceRequestStatus(zenml_status(doc["status"], doc.get("reason")))
        tolerance = labels.get(LABEL_TOLERANCE) or (
            ResourceRequestReclaimTolerance.ANY
            if doc.get("preemptible", True)
            else ResourceRequestReclaimTolerance.NONE
        )
        component = _uuid(labels.get(LABEL_COMPONENT))
        created = _naive_utc(doc["created_at"])
        assert created is not None
        body = ResourceRequestResponseBody(
            created=created,
            updated=_naive_utc(doc["updated_at"]) or created,
            user_id=_uuid(labels.get(LABEL_USER)),
            component_ids=[component] if component else [],
            step_run_id=_uuid(labels.get(LABEL_STEP_RUN)),
            pipeline_run_id=_uuid(labels.get(LABEL_RUN)),
            project_id=_uuid(labels.get(LABEL_PROJECT)),
            step_name=labels.get("step"),
            pipeline_run_name=labels.get("run"),
            pool_id=_uuid(doc.get("pool_id")),
            # respool's pool once it is placed in one (or is the only candidate); else, when
            # ``pools`` is given, the candidates (a rejection on several pools names none).
            pool_name=doc.get("pool") or (pools(doc["subject"]) if pools else None),
            demands=_demands(doc.get("resources") or {}, doc.get("node_selector")),
            status=status,
            runtime_state=runtime_state or ResourceRequestRuntimeState.UNKNOWN,
            reclaim_tolerance=ResourceRequestReclaimTolerance(tolerance),
            lease_expires_at=_naive_utc(doc.get("lease_expires_at")),
            allocated_at=_naive_utc(doc.get("allocated_at")),
            released_at=_naive_utc(doc.get("finished_at")),
            queued_at=created,
            status_reason=status_reason(doc["status"], doc.get("reason"), doc.get("message", "")),
        )
        return ResourceRequestResponse(
            id=UUID(doc["id"]),
            body=body,
            metadata=ResourceRequestResponseMetadata(),
            resources=ResourceRequestResponseResources(),
        )
