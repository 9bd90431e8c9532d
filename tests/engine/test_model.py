"""Model-based test: the SQL engine against a small pure-Python reference of the
admission rules (docs/admission.md).

A Hypothesis ``RuleBasedStateMachine`` creates single-pool requests, releases and cancels them,
resizes capacities (never below the reserved sums or current usage), changes priorities, and
shrinks below usage (a ``shrink`` rule: removes or re-adds the custom key ``tpu``, lowers several
capacities at once, or several limits of one policy at once, then reconciles), and
after every step compares the engine's statuses (with reasons), counters and queue order with
the model's, and checks that ``respool.invariant_violations`` is empty.

The model (this file only):
* pools {key: capacity} with ``best_effort`` or ``strict`` queueing; soft keys (mcpu, memory_mb,
  step_run) are untracked when the pool has no capacity for them, other missing keys mean 0;
* policies {subject, pool, priority, reserved, limit}; every request carries ``step_run: 1``;
* rejection at creation (and when a resize makes a queued request unfittable) with the
  reasons in their order (pool_missing_key, exceeds_capacity, exceeds_limit, exceeds_reserved);
* admission rules 1-3; queue order priority desc, in-share first, queue time (then id);
* every trigger (create, release, cancel, resize, priority change) runs a full allocation pass of
  the pool: ``best_effort`` grants whatever fits in order, ``strict`` stops at the first request
  that does not fit (and a pool whose tracked ``step_run`` is full grants nothing);
* the starvation guard, docs/scheduling.md (pools draw ``starvation_seconds`` None, 0, 2 or
  300): in a best_effort pass, the first request that does not fit is the head; once it has waited
  ``starvation_seconds`` a request behind it is granted only if, for every tracked key both need,
  the free units left still cover the head's need, or if its ``max_seconds`` ends by the head's
  shadow time (the earliest deadline of capped allocations at which the head would fit);
  requests may carry ``max_seconds`` and the reconciler expires them at allocated_at + max_seconds
  (reason ``max_seconds``) right after lapsed leases;
* fair share, ``ordering: fair`` (drawn per pool): between the in-share flag and queue time, the
  subject's dominant share (max over the pool's keys of used / capacity), ascending.

Reconciler (docs/preemption.md, grace period 0): requests may carry a lease (renewed by
heartbeats) and retries; a ``reconcile`` rule runs ``respool.reconcile_pool`` at the machine's
clock and the model mirrors its pass: lapsed leases expire, shrinks are enforced (all keys over at
once, victim order, minimal set; a removed custom key is capacity 0), then the queue is walked
for requests that only the pool's capacity blocks (reclaim when in share or non-preemptible,
priority preemption for preemptible borrowers), victims chosen in victim order with the minimal
set, the requester granted in the same pass, then a full allocation. A heartbeat on a lapsed
lease expires it.

The engine only tries the new request on a create in a best_effort pool (unless the pool held
for a starving head before it joined: a new head ends that hold, so it runs a full pass) and does
not re-run a best_effort pool when a queued request leaves; that is equivalent because after any
pass no queued request of a best_effort pool is admissible unless held, and neither event frees
units. The model
follows the spec and would catch a difference.

In-share subtlety: the engine computes each request's in-share flag (the queue order) once, at
the start of an allocation pass, from the usage at that moment; a grant during the pass does not
reorder the rest of that pass. The model mirrors this by sorting the queue once per pass and then
checking admission against the live counters.

All examples share one database (Hypothesis runs many); each example starts by emptying it.
Requests are created with an explicit, strictly increasing ``p_now`` so queue times are
deterministic. ``RESPOOL_MODEL_TWIN=<twin in support.twins>`` installs a known-bad engine first
(e.g. ``broken_shrink_twin``, the shrink enforcement bugs fixed earlier): the test must fail.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)

from support.model import ModelClockMachine, model_test

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
    starvation: int | None = None
    ordering: str = "fifo"

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
    max_seconds: int | None = None
    queue_lease: tuple[int, int] | None = None  # (expires, attempt): queue lease, set while queued


@dataclass
class Hold:
    """A best_effort pool holding free units for its head (starvation guard)."""

    head: MRequest
    need: dict[str, int]
    shadow: int | None


class Model:
    def __init__(self) -> None:
        self.pools: dict[str, MPool] = {}
        self.policies: dict[tuple[str, str], MPolicy] = {}
        self.requests: dict[str, MRequest] = {}
        self.grants: Counter[str] = Counter()  # grants by what triggered the pass
        self.now = 0  # the machine clock (seconds after CLOCK0) of the step being applied
        self.preempted: Counter[str] = Counter()  # preemptions by mode
        self.holds = 0  # passes in which a pool held for its head (starvation guard)

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

    def share(self, r: MRequest) -> float:
        """The subject's dominant share in a fair pool (0 in a fifo pool)."""
        pool, pol = self.pools[r.pool], self.policies[(r.subject, r.pool)]
        if pool.ordering != "fair":
            return 0.0
        return max((pol.used[k] / c for k, c in pool.capacity.items()), default=0.0)

    def queue(self, pool: str) -> list[MRequest]:
        """The pool's queue in grant order, in-share and shares computed from the usage now."""
        waiting = [r for r in self.requests.values() if r.pool == pool and r.status == "queued"]
        return sorted(
            waiting,
            key=lambda r: (
                -self.policies[(r.subject, pool)].priority,
                not self.in_share(r),
                self.share(r),
                r.seq,
            ),
        )

    # the starvation guard (docs/scheduling.md) -------------------------------------------------

    def free(self, pool: MPool) -> dict[str, int]:
        return {k: c - pool.used[k] for k, c in pool.capacity.items()}

    def hold_for(self, pool: MPool, head: MRequest) -> Hold | None:
        if (
            pool.queueing != "best_effort"
            or pool.starvation is None
            or self.now - head.seq < pool.starvation
        ):
            return None
        need = {k: n for k, n in head.resources.items() if k in pool.capacity and n > 0}
        return Hold(head, need, self.shadow(pool, need))

    def shadow(self, pool: MPool, need: dict[str, int]) -> int | None:
        free = self.free(pool)
        if all(free[k] >= n for k, n in need.items()):
            return self.now
        capped = sorted(
            (
                (r.allocated_at + r.max_seconds, r)
                for r in self.requests.values()
                if r.pool == pool.name and r.status == "allocated" and r.max_seconds is not None
            ),
            key=lambda pair: pair[0],
        )
        for deadline, r in capped:
            for k, n in r.resources.items():
                if k in free:
                    free[k] += n
            if all(free[k] >= n for k, n in need.items()):
                return max(deadline, self.now)
        return None

    def allowed_by(self, pool: MPool, hold: Hold, r: MRequest) -> bool:
        free = self.free(pool)
        leaves_room = all(
            r.resources.get(k, 0) == 0 or free[k] - r.resources[k] >= n
            for k, n in hold.need.items()
        )
        backfills = (
            r.max_seconds is not None
            and hold.shadow is not None
            and self.now + r.max_seconds <= hold.shadow
        )
        return leaves_room or backfills

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
        """Walks the queue again while a walk granted and stopped where the order decides (a
        strict stop, a hold): its grants may have changed in-share and fair shares."""
        while self._walk(pool_name, trigger):
            pass

    def _walk(self, pool_name: str, trigger: str) -> bool:
        pool = self.pools[pool_name]
        head_seen, hold, granted, stopped = False, None, 0, False
        for r in self.queue(pool_name):  # order fixed at the start of the walk
            if "step_run" in pool.capacity and pool.used["step_run"] >= pool.capacity["step_run"]:
                break
            if hold is not None and not self.allowed_by(pool, hold, r):
                continue  # held back for the starving head
            if self.admissible(r):
                self._grant(r)
                self.grants[trigger] += 1
                granted += 1
            elif pool.queueing == "strict":
                stopped = True
                break
            elif not head_seen:  # the first request that does not fit is the head
                head_seen, hold = True, self.hold_for(pool, r)
                if hold is not None:
                    self.holds += 1
        return granted > 0 and (stopped or hold is not None)

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
        if r.status == "queued" and r.lease_seconds:  # the queue lease, for this attempt
            r.queue_lease = (self.now + r.lease_seconds, r.attempt)
            return
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

    def victim_order(self, victims: list[MRequest]) -> list[MRequest]:
        """Lowest policy priority, then most recently allocated, then id descending."""
        return sorted(
            victims,
            key=lambda v: (
                self.policies[(v.subject, v.pool)].priority,
                -v.allocated_at,
                tuple(-b for b in bytes.fromhex(v.id.replace("-", ""))),
            ),
        )

    def shed(self, holders: list[MRequest], excess: dict[str, int], reason: str) -> None:
        """Shrinks: walk the victim order until every key fits, then keep the set minimal."""
        chosen: list[MRequest] = []
        for v in self.victim_order(holders):
            if not any(n > 0 and excess.get(k, 0) > 0 for k, n in v.resources.items()):
                continue
            chosen.append(v)
            for k in excess:
                excess[k] -= v.resources.get(k, 0)
            if all(e <= 0 for e in excess.values()):
                break
        for v in reversed(list(chosen)):
            if not any(excess.get(k, 0) + n > 0 for k, n in v.resources.items() if k in excess):
                for k in excess:
                    excess[k] += v.resources.get(k, 0)
                chosen.remove(v)
        for v in chosen:
            self.preempt(v, reason)

    def enforce_shrinks(self, pool_name: str) -> None:
        pool = self.pools[pool_name]
        over = {
            k: n - cap
            for k, n in pool.used.items()
            if (cap := pool.cap(k)) is not None and n > cap  # a removed custom key is 0
        }
        if over:
            self.shed(self.holders(pool_name), over, "capacity_shrink")
        for pol in sorted(self.policies.values(), key=lambda p: p.subject):
            if pol.pool != pool_name:
                continue
            over = {k: pol.used[k] - lim for k, lim in pol.limit.items() if pol.used[k] > lim}
            if over:
                mine = [h for h in self.holders(pool_name) if h.subject == pol.subject]
                self.shed(mine, over, "limit_shrink")

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
        for r in self.requests.values():  # step 1 too: lapsed queue leases
            if (
                r.pool == pool_name
                and r.status == "queued"
                and r.queue_lease is not None
                and r.queue_lease[1] == r.attempt  # a requeued attempt is not bound by it
                and r.queue_lease[0] <= self.now
            ):
                r.status, r.reason = "cancelled", "abandoned"
        for r in self.requests.values():
            if (
                r.pool == pool_name
                and r.status == "allocated"
                and r.max_seconds is not None
                and r.allocated_at + r.max_seconds <= self.now
            ):
                self._charge(r, -1)
                r.status, r.reason, r.lease_expires = "expired", "max_seconds", None
        self.enforce_shrinks(pool_name)
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

    def resize(self, pool_name: str, capacity: dict[str, int]) -> None:
        """Merge a capacity change (0 removes the key), reject what can never fit, allocate."""
        for key, n in capacity.items():
            if n:
                self.pools[pool_name].capacity[key] = n
            else:
                self.pools[pool_name].capacity.pop(key, None)
        self.revalidate(pool_name, None)
        self.allocate(pool_name, "resize")

    def set_limit(self, pol: MPolicy, limit: dict[str, int]) -> None:
        """Merge a limit change (0 removes the limit), reject what can never fit, allocate."""
        for key, n in limit.items():
            if n:
                pol.limit[key] = n
            else:
                pol.limit.pop(key, None)
        self.revalidate(pol.pool, pol.subject)
        self.allocate(pol.pool, "set_limit")

    def revalidate(self, pool_name: str, subject: str | None) -> None:
        for r in self.requests.values():
            if r.pool == pool_name and r.status == "queued" and subject in (None, r.subject):
                reason = self.rejection(r)
                if reason is not None:
                    r.status, r.reason = "rejected", reason

    def np_held(self, pool_name: str, key: str, subject: str | None = None) -> int:
        """Units of key held by non-preemptible allocations (of one subject, or all)."""
        return sum(
            r.resources.get(key, 0)
            for r in self.requests.values()
            if r.pool == pool_name
            and r.status == "allocated"
            and not r.preemptible
            and subject in (None, r.subject)
        )


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


Shape = tuple[str, str, dict[str, int], bool, int | None, int, int | None]


@st.composite
def request_st(draw: st.DrawFn) -> Shape:
    """(subject, pool, resources, preemptible, lease seconds, max retries, max seconds): mostly
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
    resources["tpu"] = draw(st.sampled_from([0, 0, 0, 1, 2] if pool == "pa" else [0] * 6 + [1]))
    resources["mcpu"] = draw(st.sampled_from([0, 0, 500, 1500]))
    preemptible = draw(st.sampled_from([True, True, True, False]))
    lease = draw(st.sampled_from([None, None, 2, 4]))  # the clock moves 1 s per step
    retries = draw(st.sampled_from([0, 0, 1]))
    return subject, pool, resources, preemptible, lease, retries, draw(st.sampled_from(MAX_SECONDS))


MAX_SECONDS = [None, None, 2, 6]  # the clock moves 1 s per step


class EngineMachine(ModelClockMachine):
    clock0 = CLOCK0

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()

    @initialize(
        queueing_a=st.sampled_from(["best_effort", "strict"]),
        queueing_b=st.sampled_from(["best_effort", "strict"]),
        gpu_a=st.integers(2, 4),
        gpu_b=st.integers(2, 3),
        step_run_a=st.sampled_from([None, 2, 3]),
        tpu_b=st.sampled_from([None, 2]),
        priorities=st.lists(st.integers(0, 2), min_size=5, max_size=5),
        starvation=st.lists(st.sampled_from([None, 0, 2, 300]), min_size=2, max_size=2),
        ordering=st.lists(st.sampled_from(["fifo", "fair"]), min_size=2, max_size=2),
    )
    def setup(
        self,
        queueing_a: str,
        queueing_b: str,
        gpu_a: int,
        gpu_b: int,
        step_run_a: int | None,
        tpu_b: int | None,
        priorities: list[int],
        starvation: list[int | None],
        ordering: list[str],
    ) -> None:
        self.wipe()
        cap_a = {"gpu": gpu_a, "tpu": 2} | ({"step_run": step_run_a} if step_run_a else {})
        cap_b = {"gpu": gpu_b} | ({"tpu": tpu_b} if tpu_b else {})
        pools = {"pa": (cap_a, queueing_a), "pb": (cap_b, queueing_b)}
        sr = {"step_run": 1} if step_run_a else {}
        policies = [  # (subject, pool, reserved, limit); s3 has no policy on pb
            ("s1", "pa", {"gpu": 1} | sr, {"gpu": 3}),
            ("s2", "pa", {"gpu": 1, "tpu": 1} | sr, {"mcpu": 1000}),  # limit on untracked mcpu
            ("s3", "pa", {}, {}),
            ("s1", "pb", {"gpu": 1}, {"step_run": 2}),  # limit on untracked step_run
            ("s2", "pb", {"gpu": 1}, {}),
        ]
        for i, (name, (capacity, queueing)) in enumerate(pools.items()):
            self.sql(
                "SELECT respool.create_pool(p_name => $1, p_capacity => $2, p_queueing => $3,"
                " p_starvation_seconds => $4, p_ordering => $5)",
                name,
                capacity,
                queueing,
                starvation[i],
                ordering[i],
            )
            self.model.pools[name] = MPool(
                name, queueing, dict(capacity), starvation=starvation[i], ordering=ordering[i]
            )
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
        max_seconds: int | None = None,
    ) -> None:
        now = self.now()
        row = self.runner.run(
            self.conn.fetchrow(
                "SELECT created, request FROM respool.create_request(jsonb_build_object("
                "'subject', $1::text, 'pool', $2::text, 'resources', $3::jsonb,"
                " 'preemptible', $4::boolean, 'lease_seconds', $6::integer,"
                " 'max_retries', $7::integer, 'max_seconds', $8::integer), p_now => $5)",
                subject,
                pool,
                resources,
                preemptible,
                now,
                lease,
                retries,
                max_seconds,
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
                max_seconds=max_seconds,
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

    def _on_live(self, data: st.DataObject, action: str, sql: str) -> MRequest:
        """Draw a live request, run ``sql`` on it (``$1`` its id, ``$2`` now), count ``action``;
        returns the model's request for the model to follow."""
        rid = data.draw(st.sampled_from(self._live()), label="request")
        self.sql(sql, rid, self.now())
        self.stats[action] += 1
        return self.model.requests[rid]

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        r = self._on_live(
            data, "release", "SELECT respool.release_request(p_id => $1::uuid, p_now => $2)"
        )
        self.model.finish(r, "released", "released_while_queued", None)

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        r = self._on_live(
            data, "cancel", "SELECT respool.cancel_request(p_id => $1::uuid, p_now => $2)"
        )
        self.model.finish(r, "cancelled", "cancelled", "cancelled")

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        r = self._on_live(
            data, "heartbeat", "SELECT respool.heartbeat_request(p_id => $1::uuid, p_now => $2)"
        )
        self.model.heartbeat(r)

    @rule(pool=st.sampled_from(POOL_NAMES))
    def reconcile(self, pool: str) -> None:
        self.reconcile_pool(pool, self.now())
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
        self._update_pool(pool, {key: capacity})
        self.stats["resize"] += 1

    def _update_pool(self, pool: str, capacity: dict[str, int]) -> None:
        self.sql(
            "SELECT respool.update_pool(p_ref => $1, p_capacity => $2, p_now => $3)",
            pool,
            capacity,
            self.now(),
        )
        self.model.resize(pool, capacity)

    def _reserved_sum(self, pool: str, key: str) -> int:
        return sum(p.reserved.get(key, 0) for p in self.model.policies.values() if p.pool == pool)

    @rule(data=st.data())
    def shrink(self, data: st.DataObject) -> None:
        """Shrinks: usage above a capacity or limit, then one reconcile pass. Removes (or
        re-adds) a custom key, or lowers several capacities, or several limits of one policy,
        at once; never below reserved sums or what non-preemptible work holds (that must fit)."""
        kind = data.draw(st.sampled_from(["key", "capacities", "limits"]), label="shrink")
        pool = data.draw(st.sampled_from(POOL_NAMES), label="pool")
        mpool = self.model.pools[pool]
        pols = sorted(
            (p for p in self.model.policies.values() if p.pool == pool), key=lambda p: p.subject
        )
        pol = data.draw(st.sampled_from(pols), label="policy")
        # Fill first (mirrored as ordinary creates), so the shrink usually puts keys over.
        for resources in ({"gpu": 1, "tpu": 1}, {"gpu": 1}, {"gpu": 1}):
            if "tpu" in mpool.capacity or "tpu" not in resources:
                self._create(pol.subject, pool, resources, True, None, 0)
        if kind == "key":
            if "tpu" not in mpool.capacity:
                change = {"tpu": data.draw(st.integers(1, 3), label="tpu back")}
            elif self._reserved_sum(pool, "tpu") == 0:
                change = {"tpu": 0}  # removed: capacity 0 for a custom key
            else:
                kind = "capacities"
        if kind == "capacities":
            change = {}
            for key in sorted(mpool.capacity):
                low = max(self._reserved_sum(pool, key), self.model.np_held(pool, key), 1)
                below = max(low, min(mpool.capacity[key], mpool.used[key] - 1))
                change[key] = data.draw(st.sampled_from([low, below]), label=f"capacity {key}")
        if kind in ("key", "capacities"):
            self._update_pool(pool, change)
        else:
            limit = {}
            for key in ("gpu", "step_run"):
                low = max(pol.reserved.get(key, 0), self.model.np_held(pool, key, pol.subject), 1)
                limit[key] = data.draw(
                    st.sampled_from([0, low, low, low + 1]), label=f"limit {key}"
                )
            self.sql(
                "SELECT respool.update_policy(p_ref => $1, p_limit => $2, p_now => $3)",
                pol.id,
                limit,
                self.now(),
            )
            self.model.set_limit(pol, limit)
        self.stats[f"shrink_{kind}"] += 1
        # Usage above a bound is I1/I2 until the reconciler acts: act now, before the checks.
        self.reconcile(pool)

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
        self.stats["passes_holding_for_a_head"] += self.model.holds
        self.stats["expired_max_seconds"] += sum(
            r.reason == "max_seconds" for r in self.model.requests.values()
        )

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


# "full" passes in ~20 s; "quick" has a tenth of the examples, half the steps.
test_engine_matches_reference_model = model_test(EngineMachine, "model test", quick=(10, 20))
