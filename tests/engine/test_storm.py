"""Concurrency storm: many real connections hammer the SQL engine while an auditor checks I1-I4.

64 workers, each on its own asyncpg connection (all open at once), loop for
``RESPOOL_STORM_SECONDS`` (default 10) doing random creates (preemptible and not, with and
without a pool, with idempotency keys including deliberate concurrent duplicates), releases,
cancels, heartbeats and a few capacity changes that never go below the reserved sums or the
current usage. An auditor reads one REPEATABLE READ snapshot every 100 ms and checks
``respool.invariant_violations`` plus ``pool_usage`` (allocated <= capacity).

A few workers also shrink ``storm-g5`` below its usage (``_shrink``: remove the custom key
``lic``, lower two capacities or two limits at once) and reconcile it in the same transaction,
then check there that no I1/I2 is left and every victim was needed (a minimal set); the broken
shrink twin (``support.twins``: the enforcement bugs fixed earlier) must fail both checks.

Deadlocks (40P01) and RP500 (InvariantBroken) are counted and must be 0; expected engine
answers (Conflict from fencing, IdempotencyMismatch) are fine; anything else fails the test.

The broken twin runs the same storm (preemptible traffic only) against a database where
``respool._blocker`` admits everything and ``respool._move_units`` has no guards (``support.twins``,
built from the real functions): the auditor must then report I1/I2 violations, which proves the
checker can fail.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from respool_client import wire as q

from app.db import policies as db_policies
from app.db import pools as db_pools
from app.db import reconcile as db_reconcile
from app.db import requests as db_requests
from app.db.errors import Conflict, IdempotencyMismatch, InvariantBroken
from support import storm
from support.storm import StormStats, storm_db

STORM_SECONDS = float(os.environ.get("RESPOOL_STORM_SECONDS", "10"))
TWIN_SECONDS = 3.0
WORKERS = 64
SHRINK_TWIN_SECONDS = 5.0

# name -> (capacity, queueing)
POOLS: dict[str, tuple[dict[str, int], str]] = {
    "storm-g1": ({"gpu": 8, "step_run": 12}, "best_effort"),  # tracks step_run
    "storm-g2": ({"gpu": 6, "tpu": 3}, "best_effort"),  # a custom key
    "storm-g3": ({"gpu": 4}, "strict"),  # fully reserved, strict
    "storm-g4": ({"gpu": 5, "mcpu": 16000}, "best_effort"),
    "storm-g5": ({"gpu": 4, "lic": 2}, "best_effort"),  # shrunk below usage, lic removed (_shrink)
}
SHRINK_POOL = "storm-g5"
SHRINK_SUBJECT = "team-g"  # its limits are lowered on two keys at once
# (subject, pool, priority, reserved, limit)
POLICIES: list[tuple[str, str, int, dict[str, int], dict[str, int]]] = [
    ("team-a", "storm-g1", 2, {"gpu": 2, "step_run": 3}, {}),
    ("team-a", "storm-g2", 1, {"gpu": 2, "tpu": 1}, {}),
    ("team-b", "storm-g1", 1, {"gpu": 2, "step_run": 3}, {"gpu": 5}),
    ("team-b", "storm-g3", 0, {"gpu": 1}, {}),
    ("team-c", "storm-g1", 0, {}, {"mcpu": 3000}),  # limit on an untracked soft key
    ("team-c", "storm-g2", 0, {}, {"step_run": 3}),  # step_run is untracked in g2
    ("team-d", "storm-g2", 2, {"gpu": 1, "tpu": 1}, {}),
    ("team-d", "storm-g3", 1, {"gpu": 2}, {}),
    ("team-d", "storm-g4", 0, {}, {}),
    ("team-e", "storm-g3", 1, {"gpu": 1}, {"gpu": 3}),
    ("team-e", "storm-g4", 1, {"gpu": 2, "mcpu": 4000}, {"gpu": 4}),
    ("team-f", "storm-g4", 0, {}, {"memory_mb": 4000}),
    ("team-f", "storm-g1", 0, {}, {"step_run": 4}),
    ("team-h", "storm-g2", 3, {}, {"gpu": 2}),
    ("team-g", "storm-g5", 1, {"gpu": 1}, {"gpu": 3, "step_run": 4}),
    ("team-b", "storm-g5", 0, {}, {}),
]
SUBJECT_POOLS: dict[str, list[str]] = {}
for _subject, _pool, *_ in POLICIES:
    SUBJECT_POOLS.setdefault(_subject, []).append(_pool)
SUBJECTS = sorted(SUBJECT_POOLS)
RESERVED_GPU: Counter[str] = Counter()
for _subject, _pool, _prio, _reserved, _limit in POLICIES:
    RESERVED_GPU[_pool] += _reserved.get("gpu", 0)

HOLDING = ("queued", "allocated", "preempting")


@dataclass
class Storm(StormStats):
    preemptible_only: bool = False
    retries_and_short_leases: bool = False  # for the reconciler storm (test_reconciler_storm.py)
    shrink_rate: float = 0.02  # share of _shrink ops: below usage, key removals, several keys
    rp500: int = 0
    # request id -> attempt, for every request some worker saw queued or allocated
    live: dict[UUID, int] = field(default_factory=dict)
    max_connections_seen: int = 0

    def summary(self, duration: float) -> str:
        total = sum(self.ops.values())
        return (
            f"storm: {total} operations in {duration:.1f}s = {total / duration:.0f} ops/s over "
            f"{WORKERS} connections (max {self.max_connections_seen} seen in pg_stat_activity); "
            f"ops {dict(self.ops)}; RP500 {self.rp500}; {self.tallies()}"
        )


def _body_for_key(key: str, preemptible_only: bool) -> dict[str, Any]:
    """A deterministic create body per idempotency key, so every duplicate replays."""
    rng = random.Random(key)
    subject = rng.choice(SUBJECTS)
    return {
        "subject": subject,
        "pool": rng.choice([None, *SUBJECT_POOLS[subject]]),
        "resources": {"gpu": rng.randint(1, 2)},
        "preemptible": preemptible_only or rng.random() < 0.7,
    }


def _random_body(rng: random.Random, preemptible_only: bool) -> dict[str, Any]:
    subject = rng.choice(SUBJECTS)
    pools = SUBJECT_POOLS[subject]
    pool = rng.choice(pools) if rng.random() < 0.7 or len(pools) == 1 else None
    preemptible = preemptible_only or rng.random() < 0.75
    resources: dict[str, int] = {}
    if rng.random() < 0.85:
        resources["gpu"] = rng.randint(1, 2) if not preemptible else rng.randint(1, 3)
    if pool in (None, "storm-g2") and rng.random() < 0.3:
        resources["tpu"] = 1
    if pool in (None, SHRINK_POOL) and rng.random() < 0.4:
        resources["lic"] = 1
    if rng.random() < 0.3:
        resources["mcpu"] = rng.choice([250, 500, 1000, 2000])
    if rng.random() < 0.1:
        resources["memory_mb"] = rng.choice([500, 1000, 3000])
    return {"subject": subject, "pool": pool, "resources": resources, "preemptible": preemptible}


def _track(st: Storm, req: q.Request) -> None:
    if req.status in HOLDING:
        st.live[req.id] = req.attempt
    else:
        st.live.pop(req.id, None)


async def _create(conn: asyncpg.Connection, st: Storm, rng: random.Random) -> str:
    roll = rng.random()
    key = None
    if roll < 0.2:
        # Deliberate duplicates: a handful of fresh keys every 250 ms, shared by all workers,
        # each with one body, so concurrent creates race on the same key and replays match.
        key = f"dup-{int((time.monotonic() - st.started) * 4)}-{rng.randint(0, 3)}"
        body = _body_for_key(key, st.preemptible_only)
    elif roll < 0.23:
        # Reuse a recent key with another body: IdempotencyMismatch (or a first create).
        key = f"dup-{max(0, int((time.monotonic() - st.started) * 4) - 1)}-{rng.randint(0, 3)}"
        body = _body_for_key(key, st.preemptible_only)
        body["resources"] = {"gpu": body["resources"]["gpu"] + 1}
    else:
        body = _random_body(rng, st.preemptible_only)
    created = await db_requests.create_request(
        conn,
        {
            "subject": body["subject"],
            "pool": body["pool"],
            "resources": body["resources"],
            "preemptible": body["preemptible"],
            "lease_seconds": _lease(st, rng),
            "max_retries": rng.randint(0, 2) if st.retries_and_short_leases and key is None else 0,
            "idempotency_key": key,
            "labels": {"storm": "1"},
        },
    )
    _track(st, created.request)
    return "create" if created.created else "create_replay"


def _lease(st: Storm, rng: random.Random) -> int | None:
    if st.retries_and_short_leases and rng.random() < 0.3:
        return 1  # lapses unless heartbeats keep it: the reconcilers expire it
    return 600 if rng.random() < 0.5 else None


async def _act(conn: asyncpg.Connection, st: Storm, rng: random.Random, kind: str) -> str:
    if not st.live:
        return await _create(conn, st, rng)
    request_id = rng.choice(list(st.live))
    attempt = st.live.get(request_id, 1)
    if rng.random() < 0.1:
        attempt += 1  # stale/foreign attempt: fencing answers Conflict
    elif rng.random() < 0.3:
        attempt = None
    fn = {
        "release": db_requests.release_request,
        "cancel": db_requests.cancel_request,
        "heartbeat": db_requests.heartbeat_request,
    }[kind]
    req = await fn(conn, request_id, attempt=attempt)
    _track(st, req)
    return kind


async def _resize(conn: asyncpg.Connection, st: Storm, rng: random.Random) -> str:
    """Grow or shrink a pool's gpu capacity, never below its reserved sum or current usage."""
    pool = rng.choice(sorted(POOLS))
    base = POOLS[pool][0]["gpu"]
    async with conn.transaction():
        # The pool row is the lock every grant in the pool takes first: usage cannot move now.
        await conn.execute("SELECT 1 FROM respool.pools WHERE name = $1 FOR UPDATE", pool)
        used = await conn.fetchval(
            "SELECT pr.used FROM respool.pool_resources pr"
            " JOIN respool.pools p ON p.id = pr.pool_id WHERE p.name = $1 AND pr.key = 'gpu'",
            pool,
        )
        low = max(int(used or 0), RESERVED_GPU[pool], 1)
        await db_pools.update_pool(
            conn, pool, capacity={"gpu": rng.randint(low, max(low, base + 3))}
        )
    return "resize"


# Victims of this transaction's shrink pass that were not needed: with its units back, none of
# the keys it holds would be over its capacity (capacity_shrink) or its subject's limit
# (limit_shrink). Shrinks want a minimal set. One shrink per transaction, and everything fit
# before it (the previous shrink was enforced in its own transaction), so the check is exact.
_UNNEEDED_VICTIMS = """
SELECT e.reason || ' ' || r.subject || ' ' || r.resources::text
  FROM respool.events e JOIN respool.requests r ON r.id = e.request_id
 WHERE e.at = now() AND e.from_status = 'allocated'
   AND e.reason IN ('capacity_shrink', 'limit_shrink')
   AND NOT EXISTS (
        SELECT FROM jsonb_each_text(r.resources) x
         WHERE (e.reason = 'capacity_shrink'
                AND EXISTS (SELECT FROM respool.pool_usage u
                             WHERE u.pool = $1 AND u.key = x.key AND u.capacity IS NOT NULL
                               AND u.allocated + x.value::bigint > u.capacity))
            OR (e.reason = 'limit_shrink'
                AND EXISTS (SELECT FROM respool.policy_usage u
                             WHERE u.pool = $1 AND u.subject = r.subject AND u.key = x.key
                               AND u."limit" IS NOT NULL AND u.used + x.value::bigint > u."limit")))
"""

_NP_HELD = """
SELECT coalesce(sum((r.resources ->> $2)::bigint), 0) FROM respool.requests r
  JOIN respool.pools p ON p.id = r.pool_id
 WHERE p.name = $1 AND r.status IN ('allocated', 'preempting') AND NOT r.preemptible
   AND ($3::text IS NULL OR r.subject = $3)
"""


async def _shrink(conn: asyncpg.Connection, st: Storm, rng: random.Random) -> str:
    """Shrinks: take the shrink pool below its usage and enforce it in the same transaction.
    First grow it back (gpu 10, lic 3; SHRINK_SUBJECT's limits gpu 4, step_run 5) and add two
    fill requests of SHRINK_SUBJECT, then remove the custom key lic, or lower gpu and lic at
    once, or lower SHRINK_SUBJECT's limits on gpu and step_run at once; never below reserved
    sums or non-preemptible holdings. Afterwards, still in the transaction: no I1/I2 in the
    pool, and every victim was needed."""
    made: list[q.Request] = []
    async with conn.transaction():
        pool_id = await conn.fetchval(
            "SELECT id FROM respool.pools WHERE name = $1 FOR UPDATE", SHRINK_POOL
        )
        policy = (await db_policies.list_policies(conn, pool=SHRINK_POOL, subject=SHRINK_SUBJECT))[
            0
        ]
        await db_pools.update_pool(conn, SHRINK_POOL, capacity={"gpu": 10, "lic": 3})
        await db_policies.update_policy(conn, str(policy.id), limit={"gpu": 4, "step_run": 5})
        for resources in ({"gpu": 1, "lic": 1}, {"gpu": 1}):
            created = await db_requests.create_request(
                conn,
                {
                    "subject": SHRINK_SUBJECT,
                    "pool": SHRINK_POOL,
                    "resources": resources,
                    "lease_seconds": 600,
                    "labels": {"storm": "fill"},
                },
            )
            made.append(created.request)
        kind = rng.choice(["key", "capacities", "limits"])
        if kind == "key":
            await db_pools.update_pool(conn, SHRINK_POOL, capacity={"lic": 0})
        elif kind == "capacities":
            low = max(RESERVED_GPU[SHRINK_POOL], 1)
            change = {"gpu": rng.randint(low, low + 2), "lic": rng.randint(1, 2)}
            await db_pools.update_pool(conn, SHRINK_POOL, capacity=change)
        else:
            limit = {}
            for key in ("gpu", "step_run"):
                low = max(1, await conn.fetchval(_NP_HELD, SHRINK_POOL, key, SHRINK_SUBJECT))
                limit[key] = rng.choice([low, low, low + 1])
            await db_policies.update_policy(conn, str(policy.id), limit=limit)
        await db_reconcile.reconcile_pool(conn, pool_id)  # this transaction holds the pool
        left = await conn.fetch(
            "SELECT invariant, key, detail FROM respool.invariant_violations"
            " WHERE pool = $1 OR subject = $2",
            SHRINK_POOL,
            SHRINK_SUBJECT,
        )
        unneeded = await conn.fetch(_UNNEEDED_VICTIMS, SHRINK_POOL)
    for req in made:  # committed now
        _track(st, req)
    for r in left:
        st.violations.append(
            f"after {kind} shrink + reconcile: {r['invariant']} {r['key']}: {r['detail']}"
        )
        st.violation_kinds[r["invariant"]] += 1
    for r in unneeded:
        st.violations.append(f"after {kind} shrink: victim not needed: {r[0]}")
        st.violation_kinds["unneeded_victim"] += 1
    return f"shrink_{kind}"


async def _step(conn: asyncpg.Connection, st: Storm, rng: random.Random) -> str:
    roll = rng.random()
    if len(st.live) > 400:
        roll = 0.5  # keep the working set bounded: release
    if roll < 0.42:
        return await _create(conn, st, rng)
    if roll < 0.68:
        return await _act(conn, st, rng, "release")
    if roll < 0.78:
        return await _act(conn, st, rng, "cancel")
    if 0.98 - st.shrink_rate <= roll < 0.98:
        return await _shrink(conn, st, rng)
    if roll < 0.99 or st.preemptible_only:
        return await _act(conn, st, rng, "heartbeat")
    return await _resize(conn, st, rng)


def _on_error(st: Storm, exc: Exception) -> None:
    if isinstance(exc, (Conflict, IdempotencyMismatch)):
        st.expected(exc)
    elif isinstance(exc, InvariantBroken):
        st.rp500 += 1
        st.errors_sample.append(f"RP500: {exc}")
    else:
        st.unexpected.append(f"{type(exc).__name__}: {exc}")


_AUDIT_SQL = """
SELECT invariant || ' ' || coalesce(pool, '-') || ' ' || coalesce(subject, '-') || ' ' || key
       || ': ' || detail
  FROM respool.invariant_violations
UNION ALL
SELECT 'I1/pool_usage ' || pool || ' ' || key || ': allocated ' || allocated || ' > capacity '
       || capacity
  FROM respool.pool_usage WHERE capacity IS NOT NULL AND allocated > capacity
"""


async def _audit_once(conn: asyncpg.Connection, st: Storm) -> list[str]:
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        rows = await conn.fetch(_AUDIT_SQL)
        open_conns = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        )
    st.snapshots += 1
    st.max_connections_seen = max(st.max_connections_seen, int(open_conns))
    found = [r[0] for r in rows]
    st.record(found)
    return found


async def _setup(conn: asyncpg.Connection) -> None:
    for name, (capacity, queueing) in POOLS.items():
        await db_pools.create_pool(conn, name=name, capacity=capacity, queueing=queueing)
    for subject, pool, priority, reserved, limit in POLICIES:
        await db_policies.create_policy(
            conn, subject=subject, pool=pool, priority=priority, reserved=reserved, limit=limit
        )


async def _run_storm(
    dsn: str,
    seconds: float,
    *,
    preemptible_only: bool = False,
    retries: bool = False,
    shrink_rate: float = 0.02,
) -> Storm:
    # Workers connect first; the clock starts when all 64 connections are open.
    st = Storm(
        deadline=float("inf"),
        preemptible_only=preemptible_only,
        retries_and_short_leases=retries,
        shrink_rate=shrink_rate,
    )
    worker = storm.worker("respool-storm", _step, _on_error)
    return await storm.run(
        dsn, st, seconds, workers=WORKERS, worker=worker, audit_once=_audit_once, period=0.1
    )


async def drain(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], int, list[Any]]:
    """Release or cancel everything that still queues or holds units; return the counters
    left non-zero, the queue entries left and the invariant violations (all empty when sound)."""
    for row in await conn.fetch(
        "SELECT id, status FROM respool.requests WHERE status = ANY($1::text[])", list(HOLDING)
    ):
        if row["status"] == "queued":
            await db_requests.cancel_request(conn, row["id"])
        else:
            await db_requests.release_request(conn, row["id"])
    left = await conn.fetch(
        "SELECT 'pool' AS kind, key, used, 0::bigint AS np_used FROM respool.pool_resources"
        " WHERE used <> 0"
        " UNION ALL SELECT 'policy', key, used, np_used FROM respool.policy_resources"
        " WHERE used <> 0 OR np_used <> 0"
    )
    queued_left = await conn.fetchval("SELECT count(*) FROM respool.queue_entries")
    return [dict(r) for r in left], int(queued_left), await db_reconcile.invariant_violations(conn)


@pytest.mark.slow
async def test_storm_keeps_invariants(db_url: str) -> None:
    async with storm_db(db_url, _setup) as conn:
        st = await _run_storm(db_url, STORM_SECONDS)
        duration = st.ops_duration
        summary = st.summary(duration)
        print(f"\n{summary}")

        # L1-ish: with nothing running, a full allocation pass of every pool grants nothing.
        pool_ids = [r["id"] for r in await conn.fetch("SELECT id FROM respool.pools ORDER BY id")]
        late = [await db_reconcile.allocate_pool(conn, pid) for pid in pool_ids]
        statuses = dict(
            await conn.fetch("SELECT status, count(*) FROM respool.requests GROUP BY status")
        )
        print(f"final statuses before cleanup: {statuses}; late grants per pool: {late}")

        left, queued_left, final_violations = await drain(conn)

        context = st.assert_clean(summary)
        assert st.rp500 == 0, context
        assert st.max_connections_seen >= WORKERS, context
        assert sum(st.ops.values()) > 0, context
        assert sum(late) == 0, f"admissible requests were left queued: {late}\n{context}"
        assert left == [], context
        assert queued_left == 0, context
        assert final_violations == [], context


@pytest.mark.slow
async def test_broken_twin_is_caught(db_url: str) -> None:
    """The same storm against an allocation path without guards: the auditor must object."""
    async with storm_db(db_url, _setup, "broken_twin"):
        st = await _run_storm(db_url, TWIN_SECONDS, preemptible_only=True, shrink_rate=0)
        summary = st.summary(st.ops_duration)
        print(f"\nbroken twin {summary}")
        context = f"{summary}\nunexpected: {st.unexpected[:10]}"
        assert not st.unexpected, context
        assert st.deadlocks == 0, context
        assert st.violation_kinds["I1"] + st.violation_kinds["I2"] > 0, context


@pytest.mark.slow
async def test_broken_shrink_twin_is_caught(db_url: str) -> None:
    """The storm against the shrink enforcement from before its fix: the checks must object to
    both bugs (a removed custom key left allocated: I1; a multi-key pass preempting a victim it
    did not need)."""
    async with storm_db(db_url, _setup, "broken_shrink_twin"):
        st = await _run_storm(db_url, SHRINK_TWIN_SECONDS, shrink_rate=0.15)
        summary = st.summary(st.ops_duration)
        print(f"\nbroken shrink twin {summary}")
        context = f"{summary}\nsample violations: {st.violations[:10]}"
        assert not st.unexpected, context
        assert st.deadlocks == 0, context
        assert st.violation_kinds["I1"] > 0, context  # lic removed, its holders kept it
        assert st.violation_kinds["unneeded_victim"] > 0, context
