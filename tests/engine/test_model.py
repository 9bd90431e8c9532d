"""Model-based test: the SQL engine against a small pure-Python reference of SPEC §4.

A Hypothesis ``RuleBasedStateMachine`` creates single-pool requests, releases and cancels them,
resizes capacities (never below the reserved sums or current usage) and changes priorities, and
after every step compares the engine's statuses (with reasons), counters and queue order with
the model's, and checks that ``respool.invariant_violations`` is empty.

The model (this file only):
* pools {key: capacity} with ``best_effort`` or ``strict`` queueing; soft keys (mcpu, memory_mb,
  step_run) are untracked when the pool has no capacity for them, other missing keys mean 0;
* policies {subject, pool, priority, reserved, limit}; every request carries ``step_run: 1``;
* rejection at creation (and when a resize makes a queued request unfittable) with the §4
  reasons in their order (pool_missing_key, exceeds_capacity, exceeds_limit, exceeds_reserved);
* admission rules 1-3; queue order priority desc, in-share first, queue time (then id);
* every trigger (create, release, cancel, resize, priority change) runs a full allocation pass of
  the pool: ``best_effort`` grants whatever fits in order, ``strict`` stops at the first request
  that does not fit (and a pool whose tracked ``step_run`` is full grants nothing).

Reconciler (SPEC §5, grace period 0): requests may carry a lease (renewed by heartbeats) and
retries; a ``reconcile`` rule runs ``respool.reconcile_pool`` at the machine's clock and the
model mirrors its pass: lapsed leases expire, then the queue is walked for requests that only the
pool's capacity blocks (reclaim when in share or non-preemptible, priority preemption for
preemptible borrowers), victims chosen in victim order with the minimal set, the requester
granted in the same pass, then a full allocation. A heartbeat on a lapsed lease expires it.

The engine only tries the new request on a create in a best_effort pool and does not re-run a
best_effort pool when a queued request leaves; that is equivalent because after any pass no
queued request of a best_effort pool is admissible and neither event frees units. The model
follows the spec and would catch a difference.

In-share subtlety: the engine computes each request's in-share flag (the queue order) once, at
the start of an allocation pass, from the usage at that moment; a grant during the pass does not
reorder the rest of that pass. The model mirrors this by sorting the queue once per pass and then
checking admission against the live counters.

All examples share one database (Hypothesis runs many); each example starts by emptying it.
Requests are created with an explicit, strictly increasing ``p_now`` so queue times are
deterministic.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.db.connect import APP_CLI, connect

T = TypeVar("T")
SOFT_KEYS = frozenset({"mcpu", "memory_mb", "step_run"})
SUBJECTS = ("s1", "s2", "s3")
POOL_NAMES = ("pa", "pb")
RANK = {"pool_missing_key": 1, "exceeds_capacity": 2, "exceeds_limit": 3, "exceeds_reserved": 4}
CLOCK0 = datetime(2030, 1, 1, tzinfo=UTC)


# --- the reference model -----------------------------------------------------------------------


@dataclass
class MPool:
    name: str
    queueing: str
    capacity: dict[str, int]
    used: Counter[str] = field(default_factory=Counter)

    def cap(self, key: str) -> int | None:
        """Effective capacity: None = untracked soft key, 0 = a missing hard key."""
        if key in self.capacity:
            return self.capacity[key]
        return None if key in SOFT_KEYS else 0


@dataclass
class MPolicy:
    id: str
    subject: str
    pool: str
    priority: int
    reserved: dict[str, int]
    limit: dict[str, int]
    used: Counter[str] = field(default_factory=Counter)
    np_used: Counter[str] = field(default_factory=Counter)


@dataclass
class MRequest:
    id: str
    seq: int
    subject: str
    pool: str
    resources: dict[str, int]
    preemptible: bool
    status: str
    reason: str | None = None
    lease_seconds: int | None = None
    max_retries: int = 0
    attempt: int = 1
    lease_expires: int | None = None  # machine clock, seconds
    allocated_at: int = 0


class Model:
    def __init__(self) -> None:
        self.pools: dict[str, MPool] = {}
        self.policies: dict[tuple[str, str], MPolicy] = {}
        self.requests: dict[str, MRequest] = {}
        self.grants: Counter[str] = Counter()  # grants by what triggered the pass
        self.now = 0  # the machine clock (seconds after CLOCK0) of the step being applied
        self.preempted: Counter[str] = Counter()  # preemptions by mode

    # admission ---------------------------------------------------------------------------------

    def rejection(self, r: MRequest) -> str | None:
        pol = self.policies.get((r.subject, r.pool))
        if pol is None:
            return "no_policy"
        pool = self.pools[r.pool]
        found: list[tuple[int, str, str]] = []
        for key, need in r.resources.items():
            cap = pool.cap(key)
            if cap == 0:
                found.append((1, key, "pool_missing_key"))
            if cap is not None and cap > 0 and need > cap:
                found.append((2, key, "exceeds_capacity"))
            if key in pol.limit and need > pol.limit[key]:
                found.append((3, key, "exceeds_limit"))
            if not r.preemptible and cap is not None and need > pol.reserved.get(key, 0):
                found.append((4, key, "exceeds_reserved"))
        return min(found)[2] if found else None

    def admissible(self, r: MRequest) -> bool:
        pool, pol = self.pools[r.pool], self.policies[(r.subject, r.pool)]
        for key in set(r.resources) | set(pol.limit):
            need = r.resources.get(key, 0)
            cap = pool.cap(key)
            if cap is not None and need > 0 and pool.used[key] + need > cap:  # rule 1
                return False
            if key in pol.limit and pol.used[key] + need > pol.limit[key]:  # rule 2
                return False
            if (
                not r.preemptible
                and cap is not None
                and need > 0  # rule 3
                and pol.np_used[key] + need > pol.reserved.get(key, 0)
            ):
                return False
        return True

    def in_share(self, r: MRequest) -> bool:
        pool, pol = self.pools[r.pool], self.policies[(r.subject, r.pool)]
        return all(
            pol.used[k] + n <= pol.reserved.get(k, 0)
            for k, n in r.resources.items()
            if pool.cap(k) is not None
        )

    def queue(self, pool: str) -> list[MRequest]:
        """The pool's queue in grant order, in-share computed from the usage now."""
        waiting = [r for r in self.requests.values() if r.pool == pool and r.status == "queued"]
        return sorted(
            waiting,
            key=lambda r: (-self.policies[(r.subject, pool)].priority, not self.in_share(r), r.seq),
        )

    # state changes -----------------------------------------------------------------------------

    def _charge(self, r: MRequest, sign: int) -> None:
        pool, pol = self.pools[r.pool], self.policies[(r.subject, r.pool)]
        for k, n in r.resources.items():
            pool.used[k] += sign * n
            pol.used[k] += sign * n
            if not r.preemptible and pool.cap(k) is not None:
                pol.np_used[k] += sign * n

    def _grant(self, r: MRequest) -> None:
        self._charge(r, +1)
        r.status, r.reason, r.allocated_at = "allocated", None, self.now
        r.lease_expires = None if r.lease_seconds is None else self.now + r.lease_seconds

    def allocate(self, pool_name: str, trigger: str) -> None:
        pool = self.pools[pool_name]
        for r in self.queue(pool_name):  # order fixed at the start of the pass
            if "step_run" in pool.capacity and pool.used["step_run"] >= pool.capacity["step_run"]:
                break
            if self.admissible(r):
                self._grant(r)
                self.grants[trigger] += 1
            elif pool.queueing == "strict":
                break

    def create(self, r: MRequest) -> None:
        self.requests[r.id] = r
        r.reason = self.rejection(r)
        if r.reason is not None:
            r.status = "rejected"
            return
        r.status = "queued"
        self.allocate(r.pool, "create")

    def finish(
        self, r: MRequest, to: str, reason_if_queued: str, reason_if_held: str | None
    ) -> None:
        if r.status == "allocated":
            self._charge(r, -1)
            r.status, r.reason, r.lease_expires = to, reason_if_held, None
        elif r.status == "queued":
            r.status, r.reason = "cancelled", reason_if_queued
        else:
            return
        self.allocate(r.pool, to)

    def heartbeat(self, r: MRequest) -> None:
        if r.status != "allocated" or r.lease_expires is None:
            return
        if r.lease_expires <= self.now:  # lapsed: expired, never revived
            self.finish(r, "expired", "", "lease_expired")
        else:
            r.lease_expires = self.now + (r.lease_seconds or 0)

    # the reconciler ----------------------------------------------------------------------------

    def tracked(self, pool: MPool, r: MRequest) -> dict[str, int]:
        return {k: n for k, n in r.resources.items() if pool.cap(k) is not None}

    def borrowing(self, pol: MPolicy) -> bool:
        pool = self.pools[pol.pool]
        return any(
            n > pol.reserved.get(k, 0) for k, n in pol.used.items() if pool.cap(k) is not None
        )

    def holders(self, pool_name: str) -> list[MRequest]:
        return [
            r
            for r in self.requests.values()
            if r.pool == pool_name and r.status == "allocated" and r.preemptible
        ]

    def choose_victims(self, r: MRequest, mode: str) -> list[MRequest] | None:
        pool, pol = self.pools[r.pool], self.policies[(r.subject, r.pool)]
        deficit = {
            k: pool.used[k] + n - pool.capacity[k]
            for k, n in r.resources.items()
            if k in pool.capacity
        }
        if all(d <= 0 for d in deficit.values()):
            return []
        over = {
            (p.subject, k): p.used[k] - p.reserved.get(k, 0)
            for p in self.policies.values()
            if p.pool == r.pool
            for k in deficit
        }

        def allowed(v: MRequest) -> bool:
            vp = self.policies[(v.subject, v.pool)]
            if mode == "reclaim":
                return v.subject != r.subject or not r.preemptible
            return vp.priority < pol.priority and v.subject != r.subject

        candidates = sorted(
            (v for v in self.holders(r.pool) if allowed(v)),
            key=lambda v: (
                v.subject != r.subject,
                self.policies[(v.subject, v.pool)].priority,
                -v.allocated_at,
                tuple(-b for b in bytes.fromhex(v.id.replace("-", ""))),
            ),
        )
        chosen: list[MRequest] = []
        for v in candidates:
            if not any(
                n > 0
                and deficit.get(k, 0) > 0
                and (v.subject == r.subject or over.get((v.subject, k), 0) > 0)
                for k, n in v.resources.items()
            ):
                continue
            chosen.append(v)
            for k, n in v.resources.items():
                if k in deficit:
                    deficit[k] -= n
                    over[(v.subject, k)] = over.get((v.subject, k), 0) - n
            if all(d <= 0 for d in deficit.values()):
                break
        if any(d > 0 for d in deficit.values()):
            return None
        for v in reversed(list(chosen)):
            if all(deficit[k] + n <= 0 for k, n in v.resources.items() if k in deficit):
                for k, n in v.resources.items():
                    if k in deficit:
                        deficit[k] += n
                chosen.remove(v)
        return chosen

    def preempt_candidate(self, r: MRequest) -> str | None:
        """The mode if rule 1 alone blocks r and some subject could lose work to it."""
        pool, pol = self.pools[r.pool], self.policies[(r.subject, r.pool)]
        if all(
            pool.used[k] + n <= pool.capacity[k]
            for k, n in r.resources.items()
            if k in pool.capacity
        ):
            return None
        if any(r.resources.get(k, 0) > lim - pol.used[k] for k, lim in pol.limit.items()):
            return None
        if not r.preemptible and any(
            n > pol.reserved.get(k, 0) - pol.np_used[k]
            for k, n in r.resources.items()
            if k in pool.capacity
        ):
            return None
        mode = "reclaim" if self.in_share(r) or not r.preemptible else "priority"
        holders = self.holders(r.pool)
        borrowers = [
            p
            for p in self.policies.values()
            if p.pool == r.pool
            and self.borrowing(p)
            and any(h.subject == p.subject for h in holders)
        ]
        if mode == "reclaim":
            own = not r.preemptible and any(h.subject == r.subject for h in holders)
            helped = own or any(p.subject != r.subject for p in borrowers)
        else:
            helped = any(p.subject != r.subject and p.priority < pol.priority for p in borrowers)
        return mode if helped else None

    def preempt(self, v: MRequest, mode: str) -> None:
        self._charge(v, -1)
        v.status, v.reason, v.lease_expires = "preempted", mode, None
        self.preempted[mode] += 1
        if v.attempt <= v.max_retries:
            v.attempt += 1
            v.status, v.reason = "queued", "retry"
            if (reason := self.rejection(v)) is not None:
                v.status, v.reason = "rejected", reason

    def reconcile(self, pool_name: str) -> None:
        pool = self.pools[pool_name]
        for r in self.requests.values():
            if (
                r.pool == pool_name
                and r.status == "allocated"
                and r.lease_expires is not None
                and r.lease_expires <= self.now
            ):
                self._charge(r, -1)
                r.status, r.reason, r.lease_expires = "expired", "lease_expired", None
        changed = True
        while changed and self.holders(pool_name):
            changed, blocked = False, False
            for r in self.queue(pool_name):
                mode = self.preempt_candidate(r)
                if mode is None or (blocked and mode == "priority"):
                    continue
                victims = self.choose_victims(r, mode)
                if victims is None:
                    blocked = pool.queueing == "strict"
                    continue
                if not victims:
                    continue
                for v in victims:
                    self.preempt(v, mode)
                assert self.admissible(r)
                self._grant(r)
                self.grants["reconcile"] += 1
                changed = True
                break
        self.allocate(pool_name, "reconcile")

    def resize(self, pool_name: str, key: str, capacity: int) -> None:
        self.pools[pool_name].capacity[key] = capacity
        for r in self.requests.values():
            if r.pool == pool_name and r.status == "queued":
                reason = self.rejection(r)
                if reason is not None:
                    r.status, r.reason = "rejected", reason
        self.allocate(pool_name, "resize")


# --- the machine ------------------------------------------------------------------------------

_STATE_SQL = """
SELECT jsonb_build_object(
    'requests', coalesce((SELECT jsonb_object_agg(id::text, jsonb_build_array(status, reason))
                            FROM respool.requests), '{}'),
    'pool_used', coalesce((SELECT jsonb_object_agg(p.name || '/' || c.key, c.used)
                             FROM respool.pool_resources c JOIN respool.pools p ON p.id = c.pool_id
                            WHERE c.used <> 0), '{}'),
    'policy_used', coalesce((SELECT jsonb_object_agg(subject || '@' || pool || '/' || key,
                                                     jsonb_build_array(used, np_used))
                               FROM respool.policy_usage WHERE used <> 0 OR np_used <> 0), '{}'),
    'queues', coalesce((SELECT jsonb_object_agg(pool, ids)
                          FROM (SELECT pool, jsonb_agg(request_id::text ORDER BY position) AS ids
                                  FROM respool.queue GROUP BY pool) q), '{}'),
    'violations', coalesce((SELECT jsonb_agg(to_jsonb(v)) FROM respool.invariant_violations v),
                           '[]'))
"""


class LoopThread:
    """A private event loop in a daemon thread: the sync state machine submits coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


Shape = tuple[str, str, dict[str, int], bool, int | None, int]


@st.composite
def request_st(draw: st.DrawFn) -> Shape:
    """(subject, pool, resources, preemptible, lease seconds, max retries): mostly
    admissible-looking, some rejections."""
    subject, pool = draw(
        st.sampled_from(
            [
                ("s1", "pa"),
                ("s2", "pa"),
                ("s3", "pa"),
                ("s1", "pb"),
                ("s2", "pb"),
            ]
            * 3
            + [("s3", "pb")]
        )
    )  # s3 has no policy on pb: no_policy
    resources = {"gpu": draw(st.sampled_from([1, 1, 1, 2, 2, 3, 0, 4]))}
    # tpu is a custom key only pa tracks (pool_missing_key on pb, now and then).
    resources["tpu"] = draw(st.sampled_from([0, 0, 0, 1, 2] if pool == "pa" else [0] * 9 + [1]))
    resources["mcpu"] = draw(st.sampled_from([0, 0, 500, 1500]))
    preemptible = draw(st.sampled_from([True, True, True, False]))
    lease = draw(st.sampled_from([None, None, 2, 4]))  # the clock moves 1 s per step
    return subject, pool, resources, preemptible, lease, draw(st.sampled_from([0, 0, 1]))


class EngineMachine(RuleBasedStateMachine):
    runner: ClassVar[LoopThread]
    conn: ClassVar[asyncpg.Connection]
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.seq = 0
        self.stats["examples"] += 1

    def sql(self, query: str, *args: Any) -> Any:
        return self.runner.run(self.conn.fetchval(query, *args))

    def now(self) -> datetime:
        self.seq += 1
        self.model.now = self.seq
        return CLOCK0 + timedelta(seconds=self.seq)

    @initialize(
        queueing_a=st.sampled_from(["best_effort", "strict"]),
        queueing_b=st.sampled_from(["best_effort", "strict"]),
        gpu_a=st.integers(2, 4),
        gpu_b=st.integers(2, 3),
        step_run_a=st.sampled_from([None, 2, 3]),
        priorities=st.lists(st.integers(0, 2), min_size=5, max_size=5),
    )
    def setup(
        self,
        queueing_a: str,
        queueing_b: str,
        gpu_a: int,
        gpu_b: int,
        step_run_a: int | None,
        priorities: list[int],
    ) -> None:
        # A fresh universe per example. DELETE rather than TRUNCATE: with a few dozen rows it is
        # ~100x faster (TRUNCATE swaps files), and Hypothesis runs hundreds of examples.
        self.runner.run(
            self.conn.execute(
                "DELETE FROM respool.events; DELETE FROM respool.queue_entries;"
                " DELETE FROM respool.requests; DELETE FROM respool.policy_resources;"
                " DELETE FROM respool.policies; DELETE FROM respool.pool_resources;"
                " DELETE FROM respool.pools;"
            )
        )
        cap_a = {"gpu": gpu_a, "tpu": 2} | ({"step_run": step_run_a} if step_run_a else {})
        pools = {"pa": (cap_a, queueing_a), "pb": ({"gpu": gpu_b}, queueing_b)}
        sr = {"step_run": 1} if step_run_a else {}
        policies = [  # (subject, pool, reserved, limit); s3 has no policy on pb
            ("s1", "pa", {"gpu": 1} | sr, {"gpu": 3}),
            ("s2", "pa", {"gpu": 1, "tpu": 1} | sr, {"mcpu": 1000}),  # limit on untracked mcpu
            ("s3", "pa", {}, {}),
            ("s1", "pb", {"gpu": 1}, {"step_run": 2}),  # limit on untracked step_run
            ("s2", "pb", {"gpu": 1}, {}),
        ]
        for name, (capacity, queueing) in pools.items():
            self.sql(
                "SELECT respool.create_pool(p_name => $1, p_capacity => $2, p_queueing => $3)",
                name,
                capacity,
                queueing,
            )
            self.model.pools[name] = MPool(name, queueing, dict(capacity))
        for (subject, pool, reserved, limit), priority in zip(policies, priorities, strict=True):
            doc = self.sql(
                "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_priority => $3,"
                " p_reserved => $4, p_limit => $5)",
                subject,
                pool,
                priority,
                reserved,
                limit,
            )
            self.model.policies[(subject, pool)] = MPolicy(
                doc["id"], subject, pool, priority, dict(reserved), dict(limit)
            )

    # rules -------------------------------------------------------------------------------------

    @rule(request=request_st())
    def create(self, request: Shape) -> None:
        self._create(*request)

    @rule(request=request_st())
    def create_more(self, request: Shape) -> None:
        self._create(*request)

    @rule(request=request_st())
    def create_even_more(self, request: Shape) -> None:
        self._create(*request)

    def _create(
        self,
        subject: str,
        pool: str,
        resources: dict[str, int],
        preemptible: bool,
        lease: int | None,
        retries: int,
    ) -> None:
        now = self.now()
        row = self.runner.run(
            self.conn.fetchrow(
                "SELECT created, request FROM respool.create_request(p_subject => $1, p_pool => $2,"
                " p_resources => $3, p_preemptible => $4, p_now => $5, p_lease_seconds => $6,"
                " p_max_retries => $7)",
                subject,
                pool,
                resources,
                preemptible,
                now,
                lease,
                retries,
            )
        )
        assert row["created"]
        doc = row["request"]
        amounts = {k: v for k, v in resources.items() if v} | {"step_run": 1}
        assert doc["resources"] == amounts
        self.model.create(
            MRequest(
                doc["id"],
                self.seq,
                subject,
                pool,
                amounts,
                preemptible,
                "queued",
                lease_seconds=lease,
                max_retries=retries,
            )
        )
        self.stats[f"create:{doc['status']}"] += 1

    @rule(
        where=st.sampled_from(
            [("pa", "s1"), ("pa", "s2"), ("pa", "s3"), ("pb", "s1"), ("pb", "s2")]
        ),
        lease=st.sampled_from([None, 3]),
        retries=st.sampled_from([0, 1]),
    )
    def borrow_the_rest(self, where: tuple[str, str], lease: int | None, retries: int) -> None:
        """One subject takes every free GPU, so later requests have work to reclaim or, at a
        higher priority, to preempt."""
        pool, subject = where
        mpool = self.model.pools[pool]
        free = mpool.capacity["gpu"] - mpool.used["gpu"]
        if free > 0:
            self._create(subject, pool, {"gpu": free}, True, lease, retries)

    def _live(self) -> list[str]:
        return [
            r.id
            for r in sorted(self.model.requests.values(), key=lambda r: r.seq)
            if r.status in ("queued", "allocated")
        ]

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._live()), label="request")
        self.sql("SELECT respool.release_request(p_id => $1::uuid, p_now => $2)", rid, self.now())
        self.model.finish(self.model.requests[rid], "released", "released_while_queued", None)
        self.stats["release"] += 1

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._live()), label="request")
        self.sql("SELECT respool.cancel_request(p_id => $1::uuid, p_now => $2)", rid, self.now())
        self.model.finish(self.model.requests[rid], "cancelled", "cancelled", "cancelled")
        self.stats["cancel"] += 1

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._live()), label="request")
        self.sql("SELECT respool.heartbeat_request(p_id => $1::uuid, p_now => $2)", rid, self.now())
        self.model.heartbeat(self.model.requests[rid])
        self.stats["heartbeat"] += 1

    @rule(pool=st.sampled_from(POOL_NAMES))
    def reconcile(self, pool: str) -> None:
        self.sql(
            "SELECT respool.reconcile_pool((SELECT id FROM respool.pools WHERE name = $1), $2)",
            pool,
            self.now(),
        )
        self.model.reconcile(pool)
        self.stats["reconcile"] += 1

    @rule(pool=st.sampled_from(POOL_NAMES))
    def reconcile_again(self, pool: str) -> None:
        self.reconcile(pool)

    @rule(data=st.data())
    def change_pool_or_policy(self, data: st.DataObject) -> None:
        """One rule for the rarer admin changes: resize a capacity or change a priority."""
        if data.draw(st.booleans(), label="resize"):
            self._resize(data)
        else:
            self._set_priority(data)

    def _resize(self, data: st.DataObject) -> None:
        pool = data.draw(st.sampled_from(POOL_NAMES), label="pool")
        mpool = self.model.pools[pool]
        key = data.draw(st.sampled_from(sorted(mpool.capacity)), label="key")
        reserved = sum(
            p.reserved.get(key, 0) for p in self.model.policies.values() if p.pool == pool
        )
        low = max(reserved, mpool.used[key], 1)
        capacity = data.draw(st.integers(low, max(low, 7)), label="capacity")
        self.sql(
            "SELECT respool.update_pool(p_ref => $1, p_capacity => $2, p_now => $3)",
            pool,
            {key: capacity},
            self.now(),
        )
        self.model.resize(pool, key, capacity)
        self.stats["resize"] += 1

    def _set_priority(self, data: st.DataObject) -> None:
        pol = data.draw(
            st.sampled_from(
                sorted(self.model.policies.values(), key=lambda p: (p.pool, p.subject))
            ),
            label="policy",
        )
        priority = data.draw(st.integers(0, 2), label="priority")
        self.sql(
            "SELECT respool.update_policy(p_ref => $1, p_priority => $2, p_now => $3)",
            pol.id,
            priority,
            self.now(),
        )
        pol.priority = priority
        self.model.allocate(pol.pool, "set_priority")
        self.stats["set_priority"] += 1

    # comparison --------------------------------------------------------------------------------

    def teardown(self) -> None:
        for trigger, n in self.model.grants.items():
            self.stats[f"granted_after_{trigger}"] += n
        for mode, n in self.model.preempted.items():
            self.stats[f"preempted_{mode}"] += n

    @invariant()
    def engine_matches_model(self) -> None:
        if not self.model.pools:
            return
        self.stats["checks"] += 1
        state = self.sql(_STATE_SQL)  # one round trip: shrinking replays many steps
        model = {r.id: [r.status, r.reason] for r in self.model.requests.values()}
        assert state["requests"] == model, self._diff(state["requests"], model)
        assert state["pool_used"] == {
            f"{p.name}/{k}": n for p in self.model.pools.values() for k, n in p.used.items() if n
        }
        assert state["policy_used"] == {
            f"{p.subject}@{p.pool}/{k}": [p.used[k], p.np_used[k]]
            for p in self.model.policies.values()
            for k in set(p.used) | set(p.np_used)
            if p.used[k] or p.np_used[k]
        }
        assert state["queues"] == {
            name: ids for name in POOL_NAMES if (ids := [r.id for r in self.model.queue(name)])
        }
        assert state["violations"] == []

    def _diff(self, engine: dict[str, Any], model: dict[str, Any]) -> str:
        lines = []
        for rid in sorted(
            set(engine) | set(model),
            key=lambda i: self.model.requests[i].seq if i in self.model.requests else 0,
        ):
            if engine.get(rid) != model.get(rid):
                r = self.model.requests.get(rid)
                what = f"{r.subject}@{r.pool} {r.resources} pre={r.preemptible}" if r else "?"
                lines.append(
                    f"request #{r.seq if r else '?'} {what}: engine {engine.get(rid)}"
                    f" model {model.get(rid)}"
                )
        return "\n".join(lines)


# Passing takes ~20 s; on a failure Hypothesis shrinks for up to 5 minutes (every shrink attempt
# replays its steps against the database), so allow that before pytest-timeout steps in.
@pytest.mark.timeout(900)
def test_engine_matches_reference_model(db_url: str) -> None:
    runner = LoopThread()
    conn = runner.run(connect(db_url, application_name=APP_CLI))
    EngineMachine.runner = runner
    EngineMachine.conn = conn
    EngineMachine.stats = Counter()
    started = datetime.now(UTC)
    try:
        run_state_machine_as_test(
            EngineMachine,
            settings=settings(
                max_examples=100,
                stateful_step_count=40,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        runner.run(conn.close())
        runner.close()
    seconds = (datetime.now(UTC) - started).total_seconds()
    print(f"\nmodel test: {dict(EngineMachine.stats)} in {seconds:.1f}s")
