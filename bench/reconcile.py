"""Scenario 6: the cost of one reconciler pass (``respool.reconcile_pool``, one transaction,
timed from the client) against the size of the queue.

Each pool has a capacity of 64 GPUs, held by 64 preemptible one-GPU requests of two subjects
(``a`` and ``b``, equal priority, no reserved share: both borrow, so step 3 has borrowers to look
at). The queue holds ``--queued`` requests spread evenly over ``--pools`` pools, in four shapes
(a or b, 1 or 2 GPUs). The first request of each shape is created by ``respool.create_request``;
the rest are copies of its rows (request, queue entry, event) made in bulk by SQL, because
creating 100,000 requests one by one would take most of the run.

* **idle**: nothing to do (nothing expired, nothing fits, nobody may preempt).
* **churn K**: before the pass, K of the pool's holders get a lapsed lease; the pass expires them
  and grants their units to the queue, in queue order.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench.common import Spread, bench_connect, broken_invariants, fresh_database, log, log_medians

CAPACITY = 64
SHAPES = (("a", 1), ("b", 1), ("a", 2), ("b", 2))

CLONE_SQL = """
WITH src AS (SELECT * FROM respool.requests WHERE id = $1),
new AS (
    INSERT INTO respool.requests (subject, pool_ref, pool_id, pool_name, candidate_pool_ids,
                                  resources, np_charge, preemptible, priority, status, reason,
                                  message, attempt, max_retries, lease_seconds, request_body,
                                  labels, version, queued_at, created_at, updated_at)
    SELECT s.subject, s.pool_ref, s.pool_id, s.pool_name, s.candidate_pool_ids, s.resources,
           s.np_charge, s.preemptible, s.priority, s.status, s.reason, s.message, s.attempt,
           s.max_retries, s.lease_seconds, s.request_body, s.labels, s.version,
           s.queued_at + g * interval '1 microsecond', s.created_at + g * interval '1 microsecond',
           s.updated_at + g * interval '1 microsecond'
      FROM src s, generate_series(1, $2) g
    RETURNING id, queued_at, created_at, attempt
), entries AS (
    INSERT INTO respool.queue_entries (pool_id, request_id, policy_id, queued_at, resources,
                                       preemptible)
    SELECT e.pool_id, n.id, e.policy_id, n.queued_at, e.resources, e.preemptible
      FROM new n, respool.queue_entries e WHERE e.request_id = $1
)
INSERT INTO respool.events (request_id, at, from_status, to_status, reason, attempt, message)
SELECT n.id, n.created_at, NULL, 'queued', NULL, n.attempt, '' FROM new n
"""


@dataclass
class ReconcileResults:
    """ms per pass, per (queued, pools) and mode ('idle', 'churn 8', ...)."""

    rows: dict[tuple[int, int], dict[str, Spread]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            f"{q} queued / {p} pools": {m: s.as_dict() for m, s in modes.items()}
            for (q, p), modes in self.rows.items()
        }


async def _create(
    conn: asyncpg.Connection, subject: str, pool: str, gpu: int
) -> tuple[uuid.UUID, str]:
    row = await conn.fetchrow(
        "SELECT (r.request ->> 'id')::uuid, r.request ->> 'status'"
        "  FROM respool.create_request(jsonb_build_object('subject', $1::text, 'pool', $2::text,"
        "                              'resources', $3::jsonb, 'lease_seconds', 3600)) r",
        subject,
        pool,
        {"gpu": gpu},
    )
    assert row is not None
    return row[0], row[1]


async def fill(conn: asyncpg.Connection, queued: int, pools: int) -> list[uuid.UUID]:
    """Pools r1..rN, full, with ``queued`` requests waiting in all; returns the pool ids."""
    per_pool = queued // pools
    ids: list[uuid.UUID] = []
    for p in range(1, pools + 1):
        name = f"r{p}"
        ids.append(
            await conn.fetchval(
                "SELECT (respool.create_pool(p_name => $1, p_capacity => $2) ->> 'id')::uuid",
                name,
                {"gpu": CAPACITY},
            )
        )
        for s in ("a", "b"):
            await conn.execute(
                "SELECT respool.create_policy(p_subject => $1, p_pool => $2)", s, name
            )
        for i in range(CAPACITY):
            _, status = await _create(conn, "ab"[i % 2], name, 1)
            assert status == "allocated", status
        for k, (subject, gpu) in enumerate(SHAPES):
            share = per_pool // len(SHAPES) + (1 if k < per_pool % len(SHAPES) else 0)
            if share == 0:
                continue
            template, status = await _create(conn, subject, name, gpu)
            assert status == "queued", status
            if share > 1:
                await conn.execute(CLONE_SQL, template, share - 1)
    await conn.execute("VACUUM ANALYZE")
    n = await conn.fetchval("SELECT count(*) FROM respool.queue_entries")
    if n != per_pool * pools:
        raise SystemExit(f"expected {per_pool * pools} queued, found {n}")
    return ids


async def _pass(conn: asyncpg.Connection, pool_id: uuid.UUID) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    doc = await conn.fetchval("SELECT respool.reconcile_pool($1)", pool_id)
    return (time.perf_counter() - started) * 1000, doc


async def _lapse(conn: asyncpg.Connection, pool_id: uuid.UUID, k: int) -> None:
    await conn.execute(
        "UPDATE respool.requests SET lease_expires_at = now() - interval '1 second'"
        " WHERE id IN (SELECT id FROM respool.requests WHERE pool_id = $1 AND status = 'allocated'"
        "              ORDER BY allocated_at, id LIMIT $2)",
        pool_id,
        k,
    )


async def measure_one(
    admin_dsn: str, queued: int, pools: int, passes: int, churn: list[int]
) -> dict[str, Spread]:
    async with fresh_database(admin_dsn) as dsn:
        conn = await bench_connect(dsn)
        try:
            started = time.perf_counter()
            ids = await fill(conn, queued, pools)
            took = time.perf_counter() - started
            log(f"  reconcile: {queued} queued in {pools} pools, filled in {took:.1f} s")
            targets = ids if pools > 1 else ids * passes
            for pool_id in ids:  # warm the plans up
                await _pass(conn, pool_id)
            modes: dict[str, Spread] = {}
            idle = []
            for pool_id in targets:
                ms, doc = await _pass(conn, pool_id)
                if any(
                    doc[k] for k in ("expired", "grace_ended", "preempted", "allocated", "rejected")
                ):
                    raise SystemExit(f"an idle pass acted: {doc}")
                idle.append(ms)
            modes["idle"] = Spread.of(idle)
            for k in churn:
                times = []
                for pool_id in targets:
                    await _lapse(conn, pool_id, k)
                    ms, doc = await _pass(conn, pool_id)
                    if doc["expired"] != k or doc["allocated"] < 1:
                        raise SystemExit(f"a churn pass did not expire {k} and grant: {doc}")
                    times.append(ms)
                modes[f"churn {k}"] = Spread.of(times)
            bad = await broken_invariants(conn)
            if bad:
                raise SystemExit(f"{bad} invariant violations after the passes")
        finally:
            await conn.close()
    log_medians(f"  reconcile: {queued} queued / {pools} pools", modes, 2)
    return modes


async def measure(
    admin_dsn: str, queued: list[int], pools: list[int], passes: int, churn: list[int]
) -> ReconcileResults:
    results = ReconcileResults()
    for p in pools:
        for q in queued:
            results.rows[(q, p)] = await measure_one(admin_dsn, q, p, passes, churn)
    return results
