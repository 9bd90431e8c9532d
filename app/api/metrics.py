"""``GET /metrics``: Prometheus text (docs/ops.md lists every metric).

Open unless ``RESPOOL_METRICS_TOKEN`` is set; then it needs ``Authorization: Bearer <token>``.

Two kinds of numbers:

* **State gauges**, read from the ops views (:class:`MetricsCache`: at most once per
  ``RESPOOL_METRICS_CACHE_SECONDS``, default 5 s, however many scrapers): capacity,
  allocated, free, reserved, borrowed and queued demand per pool and key; usage per policy;
  whether each policy is inside its windows now and how many subjects a pattern covers;
  capacity, allocated and free per node and key, and each node's state (docs/placement.md);
  per shared device, its memory offered, held by slices, and its slice holders;
  queue length and oldest wait per pool; stored requests per status; invariant violations.
  Every replica reports the same values: aggregate with ``max``, not ``sum``.
* **Event counters** (:class:`EventTally`): preemptions by pool and reason, requests by final
  status, and the allocation-wait histogram. Each scrape reads the events that appeared since the
  previous one from ``respool.events`` and adds them to counters kept in this process, so they
  count every change in the database (whichever process made it) since this process started,
  and pruning old history never makes them go down. A scrape re-reads a 10-minute window and
  skips event ids it already counted, so an event whose transaction committed late is still
  counted once.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from litestar import Controller, Request, Response, get
from litestar.datastructures import State
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from respool_client.wire import NodeState, Status

from app import __version__
from app.api.auth import AuthError
from app.api.common import db, notifier, settings
from app.db import metrics as db_metrics
from app.db.executor import Executor

__all__ = ["EventTally", "MetricsCache", "MetricsController", "WAIT_BUCKETS"]

log = logging.getLogger("respool.metrics")

STATUSES: tuple[Status, ...] = (
    "queued", "allocated", "preempting", "released", "preempted", "expired", "cancelled",
    "rejected",
)  # fmt: skip
FINAL_STATUSES = ("released", "preempted", "expired", "cancelled", "rejected")
INVARIANTS = ("I1", "I2", "I3", "I4", "I5", "I6", "I7", "I10")
NODE_STATES: tuple[NodeState, ...] = ("active", "cordoned", "draining")

# Seconds from entering the queue to the grant: sub-second grants up to day-long waits.
WAIT_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
    3600.0, 7200.0, 21600.0, 86400.0,
)  # fmt: skip

_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


class EventTally:
    """Counters fed from ``respool.events``; see the module docstring."""

    WINDOW = timedelta(minutes=10)

    def __init__(self, started: datetime | None = None) -> None:
        # No ``*_created`` series: the start time says nothing an operator needs.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.started = started or datetime.now(UTC)
        self.registry = CollectorRegistry(auto_describe=True)
        self.preemptions = Counter(
            "respool_preemptions",
            "Preemptions (each victim once, with or without grace), by pool and reason",
            ["pool", "reason"],
            registry=self.registry,
        )
        self.finished = Counter(
            "respool_requests_finished",
            "Requests that reached a terminal status, by that status",
            ["status"],
            registry=self.registry,
        )
        self.waits = Histogram(
            "respool_allocation_wait_seconds",
            "Time from entering the queue to the grant, per grant (0 for a grant at creation)",
            ["pool"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        for status in FINAL_STATUSES:
            self.finished.labels(status)
        self._seen: dict[int, datetime] = {}
        self._horizon: datetime | None = None
        self._lock = asyncio.Lock()

    async def update(self, db: Executor) -> int:
        """Count the events not counted yet; returns how many were new."""
        async with self._lock:
            since = self.started
            if self._horizon is not None:
                since = max(since, self._horizon - self.WINDOW)
            now, rows = await db_metrics.tally_events(db, since)
            new = 0
            for row in rows:
                if row.id in self._seen:
                    continue
                self._seen[row.id] = row.at
                new += 1
                pool = row.pool or ""
                if row.preemption:
                    self.preemptions.labels(pool, row.reason or "").inc()
                if row.final:
                    self.finished.labels(row.to_status).inc()
                if row.wait_seconds is not None:
                    self.waits.labels(pool).observe(max(row.wait_seconds, 0.0))
            self._horizon = now
            cutoff = now - self.WINDOW
            self._seen = {i: at for i, at in self._seen.items() if at >= cutoff}
            return new


def event_tally(state: State) -> EventTally:
    """The app's tally (``create_app`` makes it); made here on first use otherwise."""
    tally = state.get("event_tally")
    if not isinstance(tally, EventTally):
        tally = EventTally()
        state.event_tally = tally
    return tally


# The gauges per pool and key, and per policy and key: row field -> help, in the order /metrics
# lists them; the metric is respool_<scope>_<field>. A row field that is None (no capacity, no
# limit) gives no sample.
_POOL_KEY_GAUGES = {
    "capacity": "Capacity per pool and tracked key",
    "allocated": "Allocated units per pool and key",
    "free": "Capacity minus allocated, per pool and tracked key",
    "reserved": "Sum of the policies' reserved shares",
    "borrowed": "Units held above reserved shares (borrowed idle capacity)",
    "queued_demand": "Units asked for by queued requests, per pool and key",
}
# Per node and key (a node in no pool has pool=""), from respool.node_usage.
_NODE_KEY_GAUGES = {
    "capacity": "Capacity per node and key it tracks",
    "allocated": "Units placed on a node, per key",
    "free": "Node capacity minus allocated, per key (below 0 after a shrink until the reconciler"
    " acts)",
}
# Per shared device (docs/placement.md, "Sharing a GPU"), from respool.device_usage: row field ->
# (metric, help).
_DEVICE_GAUGES = {
    "memory_mb": (
        "respool_device_memory_offered_mb",
        "A shared device's memory offered to slices (device memory less what it keeps back)",
    ),
    "memory_used": ("respool_device_memory_sliced_mb", "Memory its slices hold, in MiB"),
    "slices": ("respool_device_slice_holders", "Requests holding a slice of it"),
}
_POLICY_GAUGES = {
    "used": "Units a subject holds in a pool",
    "reserved": "A subject's reserved share",
    "limit": "A subject's limit (keys with a limit only)",
    "borrowed": "Units a subject holds above its reserved share",
}
# Per pool and rate key (docs/rates.md), from respool.rate_usage; a policy's row has its
# subject (its limit as the amount, when it has one). Two metric names are not
# respool_rate_<field>: (field, metric, help).
_RATE_GAUGES = (
    ("amount", "respool_rate_amount", "A rate key's units per window (a subject: its limit)"),
    ("per_seconds", "respool_rate_window_seconds", "A rate key's sliding window, in seconds"),
    ("used", "respool_rate_used", "Units of a rate key charged inside its window now"),
    (
        "overrun",
        "respool_rate_overrun",
        "Units settled above their estimates, over the charges inside the window",
    ),
    (
        "refill_seconds",
        "respool_rate_next_refill_seconds",
        "Seconds until the oldest charge inside the window leaves it (0: none inside)",
    ),
)


def _set_fields(gauges: list[tuple[str, Gauge]], row: object, *labels: str) -> None:
    for field, gauge in gauges:
        value = getattr(row, field)
        if value is not None:
            gauge.labels(*labels).set(value)


async def _state_gauges(registry: CollectorRegistry, pool: asyncpg.Pool) -> None:
    def gauge(name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    def per(scope: str, docs: dict[str, str], *labels: str) -> list[tuple[str, Gauge]]:
        return [(f, gauge(f"respool_{scope}_{f}", doc, *labels)) for f, doc in docs.items()]

    per_key = per("pool", _POOL_KEY_GAUGES, "pool", "key")
    per_policy = per("policy", _POLICY_GAUGES, "pool", "subject", "key")
    per_node = per("node", _NODE_KEY_GAUGES, "pool", "node", "key")
    per_rate = [(f, gauge(name, doc, "pool", "subject", "key")) for f, name, doc in _RATE_GAUGES]
    per_device = [
        (f, gauge(name, doc, "pool", "node", "key", "device"))
        for f, (name, doc) in _DEVICE_GAUGES.items()
    ]
    node_state = gauge(
        "respool_node_state",
        "1 for a node's current state (active, cordoned, draining), 0 for the others",
        "pool",
        "node",
        "state",
    )
    # Policy shapes (docs/preemption.md): one series per policy, keys or not.
    policy_active = gauge(
        "respool_policy_active",
        "1 while a policy is inside one of its windows (always, without windows), else 0",
        "pool",
        "subject",
    )
    covered = gauge(
        "respool_policy_covered_subjects",
        "Subjects a pattern policy covers now (holding or queued through it); patterns only",
        "pool",
        "subject",
    )
    q_len = gauge("respool_queue_length", "Requests waiting in a pool's queue", "pool")
    q_oldest = gauge(
        "respool_queue_oldest_wait_seconds",
        "How long the oldest request in a pool's queue has waited",
        "pool",
    )
    # Shared devices (docs/placement.md, "Sharing a GPU"): the holders' reported use.
    over_holders = gauge(
        "respool_slice_over_holders",
        "Holders whose last reported use (heartbeat usage) is above their slice, by pool and"
        " <K>_memory_mb key",
        "pool",
        "key",
    )
    over_mb = gauge(
        "respool_slice_over_memory_mb",
        "MiB those holders use above their slices, summed, by pool and <K>_memory_mb key",
        "pool",
        "key",
    )
    requests = gauge("respool_requests", "Stored requests per status", "status")
    violations = gauge(
        "respool_invariant_violations",
        "Rows of respool.invariant_violations per invariant (0 when healthy)",
        "invariant",
    )

    keys = await db_metrics.pool_key_rows(pool)
    for row in keys:
        _set_fields(per_key, row, row.pool, row.key)
    for p in await db_metrics.policy_rows(pool):
        _set_fields(per_policy, p, p.pool, p.subject, p.key)
    for shape in await db_metrics.policy_shape_rows(pool):
        policy_active.labels(shape.pool, shape.subject).set(1 if shape.active else 0)
        if shape.covered_subjects is not None:
            covered.labels(shape.pool, shape.subject).set(shape.covered_subjects)
    for rate in await db_metrics.rate_rows(pool):
        _set_fields(per_rate, rate, rate.pool, rate.subject or "", rate.key)
    for nk in await db_metrics.node_key_rows(pool):
        _set_fields(per_node, nk, nk.pool or "", nk.node, nk.key)
    for d in await db_metrics.device_rows(pool):
        _set_fields(per_device, d, d.pool or "", d.node, d.key, d.device)
    for ns in await db_metrics.node_states(pool):
        for state in NODE_STATES:
            node_state.labels(ns.pool or "", ns.node, state).set(1 if ns.state == state else 0)
    stats = await db_metrics.queue_stats(pool)
    for name in sorted({row.pool for row in keys} | set(stats)):
        n, oldest = stats.get(name, (0, 0.0))
        q_len.labels(name).set(n)
        q_oldest.labels(name).set(oldest)
    for so in await db_metrics.slice_overuse_rows(pool):
        over_holders.labels(so.pool, so.key).set(so.holders)
        over_mb.labels(so.pool, so.key).set(so.over_mb)
    counts = await db_metrics.request_counts(pool)
    for status in STATUSES:
        requests.labels(status).set(counts.get(status, 0))
    broken = await db_metrics.invariant_violation_counts(pool)
    for inv in INVARIANTS:
        violations.labels(inv).set(broken.get(inv, 0))


class MetricsCache:
    """The database-derived part of a scrape, kept ``seconds`` (``RESPOOL_METRICS_CACHE_SECONDS``).

    One refresh at a time: concurrent scrapes of a stale cache wait for the same refresh
    instead of each reading the database, so scrapers cannot add database load.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.refreshes = 0
        self._lock = asyncio.Lock()
        self._until = 0.0
        self._body = b""
        self._up = 0

    async def get(self, tally: EventTally, pool: asyncpg.Pool) -> tuple[int, bytes]:
        """``(database_up, gauges text)``, refreshed when older than ``seconds``."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._until:
            return self._up, self._body
        async with self._lock:
            if loop.time() < self._until:
                return self._up, self._body
            from_db = CollectorRegistry(auto_describe=True)
            try:
                async with asyncio.timeout(10):
                    await _state_gauges(from_db, pool)
                    await tally.update(pool)
                self._up, self._body = 1, generate_latest(from_db)
            except _DB_ERRORS as exc:
                # Process metrics still answer; database gauges are left out rather than stale.
                log.warning("metrics: cannot read the database (%s)", type(exc).__name__)
                self._up, self._body = 0, b""
            self.refreshes += 1
            self._until = loop.time() + self.seconds
            return self._up, self._body


def metrics_cache(state: State) -> MetricsCache:
    """The app's cache (``create_app`` makes it); made here on first use otherwise."""
    cache = state.get("metrics_cache")
    if not isinstance(cache, MetricsCache):
        cache = MetricsCache(settings(state).metrics_cache_seconds)
        state.metrics_cache = cache
    return cache


def _check_metrics_token(state: State, authorization: str | None) -> None:
    """With ``RESPOOL_METRICS_TOKEN`` set, ``/metrics`` needs ``Authorization: Bearer <it>``."""
    expected = settings(state).metrics_token
    if expected is None:
        return
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode(), expected.encode()
    ):
        raise AuthError(401, "/metrics needs Authorization: Bearer <RESPOOL_METRICS_TOKEN>")


class MetricsController(Controller):
    tags = ["health"]

    @get("/metrics", summary="Prometheus metrics", media_type=CONTENT_TYPE_LATEST)
    async def metrics(self, state: State, request: Request[Any, Any, Any]) -> Response[bytes]:
        _check_metrics_token(state, request.headers.get("authorization"))
        registry = CollectorRegistry(auto_describe=True)
        up = Gauge(
            "respool_database_up", "1 when this scrape could read the database", registry=registry
        )
        info = Gauge("respool_build_info", "respool version", ["version"], registry=registry)
        waiters = Gauge(
            "respool_waiters", "Open long-poll waits in this process", registry=registry
        )
        listener = Gauge(
            "respool_listener_up", "1 while the LISTEN connection is up", registry=registry
        )
        reconnects = Gauge(
            "respool_listener_reconnects",
            "Reconnections of the LISTEN connection since start",
            registry=registry,
        )
        info.labels(__version__).set(1)

        tally = event_tally(state)
        is_up, from_db = await metrics_cache(state).get(tally, db(state))
        up.set(is_up)
        hub = notifier(state)
        waiters.set(hub.waiting)
        listener.set(1 if hub.healthy else 0)
        reconnects.set(hub.reconnects)
        body = generate_latest(registry) + from_db + generate_latest(tally.registry)
        # The header as Prometheus names it: Litestar would append a second charset to a text/*
        # media type, so the header is set whole rather than derived from media_type.
        return Response(
            body, media_type=CONTENT_TYPE_LATEST, headers={"content-type": CONTENT_TYPE_LATEST}
        )
