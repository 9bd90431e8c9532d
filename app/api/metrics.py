"""``GET /metrics``: Prometheus text, built per scrape from the database and this process."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.datastructures import State
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from app.api.common import db, notifier
from app.db import api_queries
from app.db.queries import Status

STATUSES: tuple[Status, ...] = (
    "queued", "allocated", "preempting", "released", "preempted", "expired", "cancelled",
    "rejected",
)  # fmt: skip


class MetricsController(Controller):
    tags = ["health"]

    @get("/metrics", summary="Prometheus metrics", media_type=CONTENT_TYPE_LATEST)
    async def metrics(self, state: State) -> Response[bytes]:
        # A fresh registry per scrape: every value is read now, nothing is kept between scrapes.
        registry = CollectorRegistry(auto_describe=True)
        labels = ["pool", "key"]
        capacity = Gauge(
            "respool_pool_capacity", "Capacity per pool and tracked key", labels, registry=registry
        )
        allocated = Gauge(
            "respool_pool_allocated", "Allocated units per pool and key", labels, registry=registry
        )
        queued = Gauge(
            "respool_pool_queued_demand",
            "Units asked for by queued requests, per pool and key",
            labels,
            registry=registry,
        )
        requests = Gauge(
            "respool_requests", "Stored requests per status", ["status"], registry=registry
        )
        waiters = Gauge(
            "respool_waiters", "Open long-poll waits in this process", registry=registry
        )
        listener = Gauge(
            "respool_listener_up", "1 while the LISTEN connection is up", registry=registry
        )
        reconnects = Gauge(
            "respool_listener_reconnects", "LISTEN reconnections since start", registry=registry
        )

        pool = db(state)
        for row in await api_queries.pool_key_usage(pool):
            if row.capacity is not None:
                capacity.labels(row.pool, row.key).set(row.capacity)
            allocated.labels(row.pool, row.key).set(row.allocated)
            queued.labels(row.pool, row.key).set(row.queued_demand)
        counts = await api_queries.request_counts(pool)
        for status in STATUSES:
            requests.labels(status).set(counts.get(status, 0))
        hub = notifier(state)
        waiters.set(hub.waiting)
        listener.set(1 if hub.healthy else 0)
        reconnects.set(hub.reconnects)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
