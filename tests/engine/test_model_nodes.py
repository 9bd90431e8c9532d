"""Model-based test of pools backed by nodes: the SQL engine against a small pure-Python
reference of placement (docs/placement.md), written from the contract's words.

A Hypothesis ``RuleBasedStateMachine`` drives one pool with nodes (``pack`` or ``spread``,
``best_effort`` or ``strict``): creates requests (with node selectors, the built-in ``node``
label, some that no node could ever hold, some non-preemptible that exceed the reserved share of
0), creates gangs (with and without ``distinct_nodes``), releases and cancels, joins nodes (with
device ids, or with anonymous gpu units), shrinks and grows a node's anonymous ``mcpu``, cordons,
drains and uncordons nodes, and runs reconciler passes. After every step the engine's statuses
(with reasons), each holder's node and gpu device ids, the node and pool counters must equal the
model's, and the node invariants (``test_placement.NODE_INVARIANTS_SQL``: I4 on nodes, I5, I6,
I7) and ``respool.invariant_violations`` must be empty.

The model (this file only):
* pool capacity per key is the sum over its nodes in any state; a soft key no node has is
  untracked, any other key no node has is capacity 0; requests carry ``step_run: 1``;
* rejection at creation, in order: the pool table (pool_missing_key, exceeds_capacity,
  exceeds_reserved: every policy reserves 0 here), then ``no_fitting_node`` when no node of the
  pool in any state could ever hold the request (none matches its selector, or none could hold
  all its amounts at once even empty); a gang member by member, then the table on the members'
  sum (they fit together or never), then with ``distinct_nodes`` as many matching nodes that
  could hold a member as members (the order of these last two: the engine's, the contract names
  none); a rejection of one member rejects the gang;
* a node change (join, capacity) rejects queued requests that can never fit any more, then
  grants what fits; a cordon or drain grants nothing new there; an uncordon grants what fits;
* admission: the pool rule on tracked keys (a gang: the members' sum), and an ``active`` node
  matching the selector where every key of the request the node tracks fits
  (``used + need <= capacity``; a soft key the node lacks is unbounded, any other key it lacks
  has no room); a gang is placed member by member in member order, each on the node the rule
  chooses (with ``distinct_nodes`` never on a node an earlier member took), all or none;
* node choice, in the contract's words: ``pack`` takes the fitting node *left with* the fewest
  free units of the request's device keys (keys with device ids on that node), then the fewest
  free units over the request's keys the node tracks, then the name; ``spread`` the most, then the
  name; devices: the first free ids in the node's list order;
* queue order: queue time (every policy has one priority and no reserved share), a gang at its
  first member's place; ``best_effort`` grants every entry that fits, in order; ``strict`` stops
  at the first that does not; every trigger (create, release, cancel, node change) runs a pass;
* reconcile (grace period 0): nodes in name order, first a shrunk node sheds the minimal set of
  its holders (victim order: most recently allocated first, ties by the higher id, a gang one
  unit named by its lowest member id holding its members' units on that node; walk until nothing
  is over, then put back every victim not needed, latest pick first), then a draining node loses
  every holder (all are preemptible here); a gang member's preemption takes its whole gang
  (reason alike); then a pass. Nothing else preempts here: one priority, no reserved shares.

All examples share one database; each starts by emptying it. Every call carries an explicit
``p_now`` one second after the previous one. ``RESPOOL_MODEL_TWIN=<twin>`` installs a known-bad
engine first (e.g. ``broken_device_twin``): the test must then fail.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)
from test_placement import NODE_INVARIANTS_SQL

from support.model import DatabaseMachine, NodeModelMachine, model_test

SOFT_KEYS = frozenset({"mcpu", "memory_mb", "step_run"})
CLOCK0 = datetime(2032, 1, 1, tzinfo=UTC)
POOL = "np"
SUBJECTS = ("s1", "s2")
TABLE_RANK = {"pool_missing_key": 1, "exceeds_capacity": 2, "exceeds_reserved": 4}

# Nodes that may join: name -> (labels, capacity of anonymous keys, gpu device ids or None).
# n1..n3 join at the start; n4 (device ids) and n5 (anonymous gpu units) join later.
JOINERS: dict[str, tuple[dict[str, str], dict[str, int], list[str] | None]] = {
    "n1": ({"gpu-type": "A100"}, {"mcpu": 8000}, ["3", "1", "0", "2"]),
    "n2": ({"gpu-type": "L4"}, {"mcpu": 4000}, ["a", "b"]),
    "n3": ({}, {"mcpu": 16000}, None),
    "n4": ({"gpu-type": "A100"}, {"mcpu": 4000}, ["g0", "g1"]),
    "n5": ({"gpu-type": "L4"}, {"mcpu": 8000, "gpu": 2}, None),
}
SELECTORS: list[dict[str, str]] = [
    {},
    {},
    {},
    {},
    {},
    {},
    {"gpu-type": "A100"},
    {"gpu-type": "L4"},
    {"gpu-type": "H100"},  # no node has it
    {"node": "n1"},
    {"node": "n3"},
    {"node": "n4"},  # before n4 joins: no node matches
]


# --- the reference model -----------------------------------------------------------------------


@dataclass
class MNode:
    name: str
    labels: dict[str, str]
    capacity: dict[str, int]
    devices: dict[str, list[str]]  # key -> ids in list order
    state: str = "active"
    used: Counter[str] = field(default_factory=Counter)
    holder: dict[str, str] = field(default_factory=dict)  # "key/device" -> request id

    def matches(self, selector: dict[str, str]) -> bool:
        labels = self.labels | {"node": self.name}
        return all(labels.get(k) == v for k, v in selector.items())

    def could_hold(self, need: dict[str, int], used: Counter[str] | None = None) -> bool:
        """Every key of ``need`` fits (with ``used``: now; without: on the empty node)."""
        for key, n in need.items():
            if key in self.capacity:
                if (used[key] if used is not None else 0) + n > self.capacity[key]:
                    return False
            elif key not in SOFT_KEYS:
                return False
        return True

    def left(self, need: dict[str, int], device_keys: bool) -> int:
        """Free units left after placing ``need``: over its device keys, or its tracked keys."""
        return sum(
            self.capacity[k] - self.used[k] - n
            for k, n in need.items()
            if k in self.capacity and (not device_keys or k in self.devices)
        )


@dataclass
class MRequest:
    id: str
    seq: int
    subject: str
    resources: dict[str, int]
    preemptible: bool
    selector: dict[str, str]
    queued_at: tuple[int, int]  # (clock, member index)
    status: str = "queued"
    reason: str | None = None
    gang: str | None = None
    distinct: bool = False
    node: str | None = None
    devices: list[str] = field(default_factory=list)
    allocated_at: int = 0


class Model:
    def __init__(self, placement: str, queueing: str) -> None:
        self.placement = placement
        self.queueing = queueing
        self.nodes: dict[str, MNode] = {}
        self.requests: dict[str, MRequest] = {}
        self.pool_used: Counter[str] = Counter()
        self.now = 0
        self.stats: Counter[str] = Counter()

    # capacity and rejection

    def pool_cap(self, key: str) -> int | None:
        having = [n.capacity[key] for n in self.nodes.values() if key in n.capacity]
        if having:
            return sum(having)
        return None if key in SOFT_KEYS else 0

    def table(self, need: dict[str, int], preemptible: bool) -> str | None:
        """The pool's rejection table: the first reason by rank, then key."""
        found: list[tuple[int, str, str]] = []
        for key, n in need.items():
            cap = self.pool_cap(key)
            if cap == 0:
                found.append((1, key, "pool_missing_key"))
            elif cap is not None and n > cap:
                found.append((2, key, "exceeds_capacity"))
            if not preemptible and cap is not None:  # reserved 0 everywhere
                found.append((4, key, "exceeds_reserved"))
        return min(found)[2] if found else None

    def rejection(self, members: list[MRequest]) -> str | None:
        """Why a request (or a gang) can never fit: each member on its own (the table, then the
        node rule), then a gang's members together (they fit together or never)."""
        first = members[0]
        matching = [n for n in self.nodes.values() if n.matches(first.selector)]
        for r in members:
            if reason := self.table(r.resources, r.preemptible):
                return reason
            if not matching or not any(n.could_hold(r.resources) for n in matching):
                return "no_fitting_node"
        total: Counter[str] = Counter()
        for r in members:
            total.update(r.resources)
        if reason := self.table(total, first.preemptible):
            return reason
        if first.distinct and sum(
            any(n.could_hold(r.resources) for r in members) for n in matching
        ) < len(members):
            return "no_fitting_node"
        if len(members) > 1 and arrangement(members, matching, self.placement, now=False) is None:
            return "no_fitting_node"  # no arrangement of the members on the nodes, even empty
        return None

    # placement

    def choose(self, r: MRequest, exclude: set[str]) -> MNode | None:
        fitting = [
            n
            for n in self.nodes.values()
            if n.state == "active"
            and n.name not in exclude
            and n.matches(r.selector)
            and n.could_hold(r.resources, n.used)
        ]
        if not fitting:
            return None
        sign = 1 if self.placement == "pack" else -1
        return min(
            fitting,
            key=lambda n: (
                sign * n.left(r.resources, True),
                sign * n.left(r.resources, False),
                n.name,
            ),
        )

    def place(self, r: MRequest, node: MNode) -> None:
        r.node = node.name
        r.devices = []
        for key, n in r.resources.items():
            if key in node.capacity:
                node.used[key] += n
            if key in node.devices:
                free = [d for d in node.devices[key] if f"{key}/{d}" not in node.holder]
                for d in free[:n]:
                    node.holder[f"{key}/{d}"] = r.id
                if key == "gpu":
                    r.devices = free[:n]

    def unplace(self, r: MRequest) -> None:
        for key, n in r.resources.items():
            self.pool_used[key] -= n
        node = self.nodes[r.node] if r.node else None
        if node is not None:
            for key, n in r.resources.items():
                if key in node.capacity:
                    node.used[key] -= n
            for slot in [s for s, h in node.holder.items() if h == r.id]:
                del node.holder[slot]
        r.node = None
        r.devices = []

    def entries(self) -> list[list[MRequest]]:
        """Queue entries in queue order: a single request, or a gang's queued members."""
        out: dict[str, list[MRequest]] = {}
        for r in sorted(self.requests.values(), key=lambda r: (r.queued_at, r.id)):
            if r.status == "queued":
                out.setdefault(r.gang or r.id, []).append(r)
        return list(out.values())

    def try_grant(self, members: list[MRequest]) -> bool:
        need: Counter[str] = Counter()
        for r in members:
            need.update(r.resources)
        for key, n in need.items():
            cap = self.pool_cap(key)
            if cap is not None and self.pool_used[key] + n > cap:
                return False
        chosen: list[tuple[MRequest, MNode]] = []
        taken: set[str] = set()
        saved = {name: (Counter(n.used), dict(n.holder)) for name, n in self.nodes.items()}
        for r in members:
            node = self.choose(r, taken if r.distinct else set())
            if node is None:
                for name, (used, holder) in saved.items():  # all or none
                    self.nodes[name].used, self.nodes[name].holder = used, holder
                for r2, _ in chosen:
                    r2.node, r2.devices = None, []
                return self.grant_arranged(members, need)
            self.place(r, node)
            chosen.append((r, node))
            taken.add(node.name)
        for r in members:
            r.status = "allocated"
            r.allocated_at = self.now
        self.pool_used.update(need)
        self.stats["granted_gang" if len(members) > 1 else "granted"] += 1
        return True

    def allocate(self) -> None:
        for members in self.entries():
            if not self.try_grant(members) and self.queueing == "strict":
                break

    def grant_arranged(self, members: list[MRequest], need: Counter[str]) -> bool:
        """A gang member by member left without a node: the first arrangement on the active
        matching nodes' free units (see ``arrangement``), or none."""
        active = [
            n for n in self.nodes.values() if n.state == "active" and n.matches(members[0].selector)
        ]
        found = arrangement(members, active, self.placement, now=True)
        if found is None:
            return False
        for r, node in zip(members, found, strict=True):
            self.place(r, node)
        for r in members:
            r.status = "allocated"
            r.allocated_at = self.now
        self.pool_used.update(need)
        self.stats["granted_gang_arranged"] += 1
        return True

    def revalidate(self) -> None:
        for members in self.entries():
            reason = self.rejection(members)
            if reason is not None:
                for r in members:
                    r.status, r.reason = "rejected", reason
                self.stats["rejected_later"] += 1

    def settle(self) -> None:
        self.revalidate()
        self.allocate()

    # lifecycle

    def create(self, members: list[MRequest]) -> None:
        for r in members:
            self.requests[r.id] = r
        reason = self.rejection(members)
        if reason is not None:
            for r in members:
                r.status, r.reason = "rejected", reason
            self.stats[f"rejected_{reason}"] += 1
            return
        self.allocate()

    def gang_of(self, r: MRequest) -> list[MRequest]:
        """``r`` alone, or its gang's members still queued or allocated."""
        if not r.gang:
            return [r]
        return [
            m
            for m in self.requests.values()
            if m.gang == r.gang and m.status in ("queued", "allocated")
        ]

    def finish(self, r: MRequest, status: str) -> None:
        """release / cancel: a gang member's cancel takes its gang along; a release does not."""
        targets = self.gang_of(r) if status == "cancelled" else [r]
        for m in targets:
            if m.status == "allocated":
                self.unplace(m)
            m.status, m.reason = status, ("cancelled" if status == "cancelled" else None)
        self.allocate()

    def preempt(self, r: MRequest, reason: str) -> None:
        targets = self.gang_of(r)
        for m in targets:
            if m.status == "allocated":
                self.unplace(m)
            m.status, m.reason = "preempted", reason
        self.stats[f"preempted_{reason}"] += 1

    def units_on(self, node: MNode) -> list[tuple[MRequest, dict[str, int]]]:
        """Victim units placed on a node, in victim order: (unit, units it holds there)."""
        units: dict[str, tuple[MRequest, Counter[str]]] = {}
        for r in self.requests.values():
            if r.status != "allocated" or r.node != node.name:
                continue
            if r.gang:
                lowest = min(
                    m.id
                    for m in self.requests.values()
                    if m.gang == r.gang and m.status == "allocated"
                )
                key = lowest
            else:
                key = r.id
            unit = units.setdefault(key, (self.requests[key], Counter()))
            unit[1].update({k: n for k, n in r.resources.items() if k in node.capacity})
        ordered = sorted(units.values(), key=lambda u: (u[0].allocated_at, u[0].id), reverse=True)
        return [(u, dict(held)) for u, held in ordered]

    def shed(self, node: MNode) -> None:
        """A shrunk node: the minimal set of its holders, in victim order, that makes it fit."""
        over = {k: node.used[k] - c for k, c in node.capacity.items() if node.used[k] > c}
        if not over:
            return
        chosen: list[tuple[MRequest, dict[str, int]]] = []
        for unit, held in self.units_on(node):
            if not any(v > 0 for v in over.values()):
                break
            if not any(n > 0 and over.get(k, 0) > 0 for k, n in held.items()):
                continue  # frees nothing that is over
            chosen.append((unit, held))
            for k, n in held.items():
                if k in over:
                    over[k] -= n
        keep = [True] * len(chosen)
        for i in reversed(range(len(chosen))):  # put back what was not needed, latest first
            held = chosen[i][1]
            back = {k: over[k] + n for k, n in held.items() if k in over}
            if not any(n > 0 and back.get(k, 0) > 0 for k, n in held.items()):
                over.update(back)
                keep[i] = False
        for (unit, _), kept in zip(chosen, keep, strict=True):
            if kept:
                self.preempt(unit, "capacity_shrink")

    def reconcile(self) -> None:
        for name in sorted(self.nodes):
            node = self.nodes[name]
            self.shed(node)
            if node.state == "draining":
                for unit, _ in self.units_on(node):
                    if unit.status == "allocated":
                        self.preempt(unit, "node_drain")
        self.allocate()


def arrangement(
    members: list[MRequest], nodes: list[MNode], placement: str, *, now: bool
) -> list[MNode] | None:
    """A gang's arrangement on nodes (docs/placement.md, gangs on nodes): each member on one
    node (``distinct``: different ones) where every key fits (a soft key the node lacks is
    unbounded, any other key it lacks has room 0); ``now``: on the nodes' free units, else on the
    empty nodes. The first found, members largest first (by their share of the largest room of
    each key, then member order) and nodes in the pool's placement order (free units over the
    gang's keys: pack fewest first, spread most; then the name), depth first; None when none."""
    keys = sorted({k for r in members for k, n in r.resources.items() if n > 0})
    big = 2**63 - 1

    def room0(n: MNode, k: str) -> int:
        if k not in n.capacity:
            return big if k in SOFT_KEYS else 0
        return n.capacity[k] - (n.used[k] if now else 0)

    sign = -1 if placement == "spread" else 1
    order = sorted(
        nodes,
        key=lambda n: (
            sign * sum(n.capacity[k] - (n.used[k] if now else 0) for k in keys if k in n.capacity),
            n.name,
        ),
    )
    room = [[room0(n, k) for k in keys] for n in order]
    if not order or (members[0].distinct and len(order) < len(members)):
        return None
    need = [[r.resources.get(k, 0) for k in keys] for r in members]
    largest = [
        max(1, max(min(room[j][i], big // 2) for j in range(len(order)))) for i in range(len(keys))
    ]
    ords = sorted(
        range(len(members)),
        key=lambda m: (-sum(need[m][i] / largest[i] for i in range(len(keys))), m),
    )
    choice: list[int] = []
    distinct = members[0].distinct

    def dfs(d: int) -> bool:
        if d == len(ords):
            return True
        m = ords[d]
        for j in range(len(order)):
            if distinct and j in choice:
                continue
            if all(need[m][i] <= room[j][i] for i in range(len(keys))):
                for i in range(len(keys)):
                    room[j][i] -= need[m][i]
                choice.append(j)
                if dfs(d + 1):
                    return True
                choice.pop()
                for i in range(len(keys)):
                    room[j][i] += need[m][i]
        return False

    if not dfs(0):
        return None
    by_member = dict(zip(ords, choice, strict=True))
    return [order[by_member[m]] for m in range(len(members))]


# --- the machine -------------------------------------------------------------------------------

_STATE_SQL = """
SELECT jsonb_build_object(
    'requests', coalesce((SELECT jsonb_object_agg(r.id::text, jsonb_build_array(
                              r.status, r.reason, n.name,
                              coalesce((SELECT jsonb_agg(d.device ORDER BY d.position)
                                          FROM respool.node_devices d
                                         WHERE d.holder_id = r.id AND d.key = 'gpu'), '[]')))
                            FROM respool.requests r
                            LEFT JOIN respool.placements pl ON pl.request_id = r.id
                            LEFT JOIN respool.nodes n ON n.id = pl.node_id), '{}'),
    'node_used', coalesce((SELECT jsonb_object_agg(n.name || '/' || nr.key, nr.used)
                             FROM respool.node_resources nr
                             JOIN respool.nodes n ON n.id = nr.node_id
                            WHERE nr.used <> 0), '{}'),
    'pool_used', coalesce((SELECT jsonb_object_agg(key, used) FROM respool.pool_resources
                            WHERE used <> 0), '{}'),
    'violations', coalesce((SELECT jsonb_agg(to_jsonb(v)) FROM respool.invariant_violations v),
                           '[]'))
"""


@st.composite
def shape_st(draw: st.DrawFn) -> tuple[str, dict[str, int], bool, dict[str, str]]:
    subject = draw(st.sampled_from(SUBJECTS))
    resources = {
        "gpu": draw(st.sampled_from([0, 1, 1, 1, 1, 2, 2, 2, 3, 5])),
        "mcpu": draw(st.sampled_from([0, 0, 500, 1000, 2000, 2000, 4000, 9000])),
    }
    resources = {k: n for k, n in resources.items() if n}
    if not resources:
        resources = {"gpu": 1}
    preemptible = draw(st.sampled_from([True] * 7 + [False]))
    return subject, resources, preemptible, draw(st.sampled_from(SELECTORS))


def node_violations(machine: DatabaseMachine, but_over: Collection[str]) -> list[str]:
    """The node invariants broken now, but a node of ``but_over`` over its capacity (a shrink
    the reconciler has not enforced yet)."""
    found = machine.runner.run(machine.conn.fetch(NODE_INVARIANTS_SQL))
    return [
        v[0]
        for v in found
        if not (v[0].startswith("I5 node ") and v[0].split()[2].split("/")[0] in but_over)
    ]


class NodeMachine(NodeModelMachine):
    pool = POOL
    cancellable = ("queued", "allocated")
    clock0 = CLOCK0

    def __init__(self) -> None:
        super().__init__()
        self.model = Model("pack", "best_effort")
        self.started = False

    @initialize(
        placement=st.sampled_from(["pack", "spread"]),
        queueing=st.sampled_from(["best_effort", "best_effort", "strict"]),
    )
    def setup(self, placement: str, queueing: str) -> None:
        self.wipe()
        self.model = Model(placement, queueing)
        self.sql(
            "SELECT respool.create_pool(p_name => $1, p_queueing => $2, p_placement => $3,"
            " p_starvation_seconds => NULL, p_now => $4)",
            POOL,
            queueing,
            placement,
            self.now(),
        )
        for subject in SUBJECTS:
            self.sql(
                "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_now => $3)",
                subject,
                POOL,
                self.now(),
            )
        for name in ("n1", "n2", "n3"):
            self._join(name)
        self.started = True

    def _join(self, name: str) -> None:
        labels, capacity, gpus = JOINERS[name]
        body: dict[str, Any] = {"name": name, "pool": POOL, "labels": labels, "capacity": capacity}
        if gpus is not None:
            body["devices"] = {"gpu": gpus}
        self.sql("SELECT respool.create_node($1, p_now => $2)", body, self.now())
        cap = dict(capacity) | ({"gpu": len(gpus)} if gpus is not None else {})
        self.model.nodes[name] = MNode(
            name, dict(labels), cap, {"gpu": list(gpus)} if gpus is not None else {}
        )
        self.model.settle()

    # rules ---------------------------------------------------------------------------------------

    @rule(shape=shape_st())
    def create(self, shape: tuple[str, dict[str, int], bool, dict[str, str]]) -> None:
        self._create(*shape)

    @rule(shape=shape_st())
    def create_more(self, shape: tuple[str, dict[str, int], bool, dict[str, str]]) -> None:
        self._create(*shape)

    def _create(
        self, subject: str, resources: dict[str, int], preemptible: bool, selector: dict[str, str]
    ) -> None:
        now = self.now()
        body: dict[str, Any] = {
            "subject": subject,
            "pool": POOL,
            "resources": resources,
            "preemptible": preemptible,
        }
        if selector:
            body["node_selector"] = selector
        doc = self.sql("SELECT request FROM respool.create_request($1, p_now => $2)", body, now)
        r = MRequest(
            doc["id"],
            self.seq,
            subject,
            resources | {"step_run": 1},
            preemptible,
            dict(selector),
            (self.seq, 0),
        )
        self.model.create([r])
        self.stats["create"] += 1

    @rule(
        subject=st.sampled_from(SUBJECTS),
        size=st.integers(2, 3),
        gpu=st.sampled_from([1, 1, 2, 3]),
        mcpu=st.sampled_from([0, 0, 1000]),
        distinct=st.booleans(),
        selector=st.sampled_from([{}, {}, {"gpu-type": "A100"}, {"gpu-type": "L4"}]),
    )
    def create_gang(
        self,
        subject: str,
        size: int,
        gpu: int,
        mcpu: int,
        distinct: bool,
        selector: dict[str, str],
    ) -> None:
        resources = {"gpu": gpu} | ({"mcpu": mcpu} if mcpu else {})
        self._create_gang(subject, [resources] * size, distinct, selector)
        self.stats["create_gang"] += 1

    def _create_gang(
        self,
        subject: str,
        resources: list[dict[str, int]],
        distinct: bool,
        selector: dict[str, str],
    ) -> None:
        """One all-or-nothing gang, a member per entry of ``resources``, into engine and model."""
        now = self.now()
        bodies: list[dict[str, Any]] = [
            {"subject": subject, "pool": POOL, "resources": res}
            | ({"node_selector": selector} if selector else {})
            for res in resources
        ]
        rows = self.fetch(
            "SELECT member, request FROM respool.create_requests($1,"
            " p_all_or_nothing => true, p_now => $2, p_distinct_nodes => $3) ORDER BY member",
            bodies,
            now,
            distinct,
        )
        gang = rows[0]["request"]["gang_id"]
        members = [
            MRequest(
                row["request"]["id"],
                self.seq,
                subject,
                res | {"step_run": 1},
                True,
                dict(selector),
                (self.seq, i),
                gang=gang,
                distinct=distinct,
            )
            for i, (row, res) in enumerate(zip(rows, resources, strict=True))
        ]
        self.model.create(members)

    @rule(
        subject=st.sampled_from(SUBJECTS),
        gpus=st.one_of(
            # (1 then 3 then 2 on a 4-GPU and a 2-GPU node: member by member, pack leaves the
            # 2 no node; 3 + 1 and 2 hold them)
            st.just([1, 3, 2]),
            st.lists(st.sampled_from([1, 2, 2, 3, 3, 4]), min_size=2, max_size=4),
        ),
        distinct=st.booleans(),
        selector=st.sampled_from([{}, {}, {"gpu-type": "A100"}]),
    )
    def create_mixed_gang(
        self, subject: str, gpus: list[int], distinct: bool, selector: dict[str, str]
    ) -> None:
        """A gang of members of different sizes: some no arrangement of the nodes can hold
        (rejected no_fitting_node although each member fits a node and the sum fits the pool),
        some that fit only in another arrangement than member by member."""
        self._create_gang(subject, [{"gpu": g} for g in gpus], distinct, selector)
        self.stats["create_mixed_gang"] += 1

    def pick_key(self, r: MRequest) -> Any:
        return (r.seq, r.queued_at)

    @precondition(lambda self: any(r.status == "allocated" for r in self.model.requests.values()))
    @rule(data=st.data())
    def release_more(self, data: st.DataObject) -> None:
        self.release(data)

    @precondition(lambda self: self.started and len(self.model.nodes) < len(JOINERS))
    @rule(data=st.data())
    def join_node(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(set(JOINERS) - set(self.model.nodes))))
        self._join(name)
        self.stats["join"] += 1

    @precondition(lambda self: self.started)
    @rule(
        data=st.data(),
        mcpu=st.sampled_from([1000, 2000, 4000, 8000, 16000]),
        reconcile=st.booleans(),
    )
    def resize_node(self, data: st.DataObject, mcpu: int, reconcile: bool) -> None:
        """A node's anonymous mcpu shrinks or grows; the shrink is enforced by a reconciler
        pass (here at once, or at the next reconcile rule)."""
        name = data.draw(st.sampled_from(sorted(self.model.nodes)))
        self.sql(
            "SELECT respool.update_node($1, $2, p_now => $3)",
            name,
            {"capacity": {"mcpu": mcpu}},
            self.now(),
        )
        self.model.nodes[name].capacity["mcpu"] = mcpu
        self.model.settle()
        self.stats["resize"] += 1
        if reconcile:
            self.reconcile()

    # comparison ----------------------------------------------------------------------------------

    state_sql = _STATE_SQL

    def model_requests(self) -> dict[str, Any]:
        return {r.id: [r.status, r.reason, r.node, r.devices] for r in self.model.requests.values()}

    def check_state(self, state: dict[str, Any]) -> None:
        node_used = {
            f"{n.name}/{k}": u for n in self.model.nodes.values() for k, u in n.used.items() if u
        }
        assert state["node_used"] == node_used
        assert state["pool_used"] == {k: u for k, u in self.model.pool_used.items() if u}
        over_ok = {  # a shrink not enforced yet (I5 holds within one reconcile interval)
            n.name
            for n in self.model.nodes.values()
            if any(n.used[k] > c for k, c in n.capacity.items())
        }
        # ... and so may the pool's derived capacity (I1), until the same pass.
        assert [
            v
            for v in state["violations"]
            if not (
                v["invariant"] == "I5"
                and v["detail"].split(":")[0].removeprefix("node ") in over_ok
            )
            and not (v["invariant"] == "I1" and over_ok)
        ] == []
        assert node_violations(self, but_over=over_ok) == []

    def _diff(self, engine: dict[str, Any], model: dict[str, Any]) -> str:
        lines = [
            f"placement {self.model.placement}, queueing {self.model.queueing}; nodes: "
            + "; ".join(
                f"{n.name} {n.state} cap {n.capacity} used {dict(n.used)} labels {n.labels}"
                for n in self.model.nodes.values()
            )
        ]
        for r in sorted(self.model.requests.values(), key=lambda r: (r.seq, r.queued_at)):
            mark = "  " if engine.get(r.id) == model.get(r.id) else "!!"
            lines.append(
                f"{mark} #{r.seq}.{r.queued_at[1]} {r.subject} {r.resources} pre={r.preemptible}"
                f" sel={r.selector} gang={'yes' if r.gang else 'no'}"
                f"{'/distinct' if r.distinct else ''}:"
                f" engine {engine.get(r.id)} model {model.get(r.id)}"
            )
        return "\n".join(lines)


test_engine_matches_node_model = model_test(NodeMachine, "node model test", quick=(8, 20))


# --- node changes during a grace period: earmarks follow their node -----------------------------
#
# A second machine, with its own pool: a grace period, one subject (``owner``) with a reserved
# share and two borrowers, so reclaim preempts and earmarks nodes. Nodes are cordoned, drained,
# uncordoned, deleted and moved with force (and join again), and shrunk or grown, while victims
# are in their grace period. No reference model of who gets what (the grace makes timing part of
# the state); instead, after every step:
# * the invariants (``respool.invariant_violations``, the node invariants) hold, but for the
#   documented transient of a shrink (I1/I5 while a node is over its capacity);
# * every earmark in the pool names an active node of the pool that matches its request and could
#   hold it (an earmark never outlives its node, even for one transaction);
# and after ``settle`` (reconciler passes past every grace period, the clock moving on), L1 on
# nodes: no earmark and no victim in its grace period remain, no queued request fits an active
# node, and no in-share request of ``owner`` waits while some active node it matches could hold
# it once the borrowers' preemptible units there were gone.

EPOOL = "ep"
ESIDE = "side"
EGRACE = 10
EGPUS = 4
ENODES = ("m1", "m2", "m3")
OWNER_SHARE = 4
SETTLE_PERIODS = 40  # far more grace periods than any chain of preemptions here needs


_EARMARK_SQL = """
SELECT coalesce(jsonb_agg(r.id::text || ' on ' || coalesce(n.name, '(gone)') || ' '
                          || coalesce(n.state, '') || ' ' || coalesce(p.name, '')), '[]')
  FROM respool.requests r
  LEFT JOIN respool.nodes n ON n.id = r.earmark_node_id
  LEFT JOIN respool.pools p ON p.id = n.pool_id
 WHERE r.earmark_pool_id = (SELECT id FROM respool.pools WHERE name = $1)
   AND r.status = 'queued'
   AND NOT (n.state IS NOT DISTINCT FROM 'active' AND p.name IS NOT DISTINCT FROM $1
            AND NOT EXISTS (SELECT FROM jsonb_each_text(r.resources) x
                             LEFT JOIN respool.node_resources nr
                                    ON nr.node_id = n.id AND nr.key = x.key
                             WHERE x.key <> 'step_run'
                               AND coalesce(nr.capacity, 0) < x.value::bigint))
"""

_L1_SQL = """
WITH pool AS (SELECT id FROM respool.pools WHERE name = $1),
node_free AS (
    SELECT n.id, n.name, n.labels, nr.capacity - nr.used AS free,
           nr.capacity - nr.used + coalesce((
               SELECT sum((pl.resources ->> 'gpu')::bigint)
                 FROM respool.placements pl JOIN respool.requests v ON v.id = pl.request_id
                 JOIN respool.policies vp ON vp.id = v.policy_id
                WHERE pl.node_id = n.id AND v.status = 'allocated' AND v.preemptible
                  AND vp.subject <> 'owner'), 0) AS reclaimable
      FROM respool.nodes n JOIN respool.node_resources nr ON nr.node_id = n.id AND nr.key = 'gpu'
     WHERE n.pool_id = (SELECT id FROM pool) AND n.state = 'active'),
owner_used AS (
    SELECT coalesce(sum((r.resources ->> 'gpu')::bigint), 0) AS used
      FROM respool.requests r JOIN respool.policies p ON p.id = r.policy_id
     WHERE p.subject = 'owner' AND r.pool_id = (SELECT id FROM pool)
       AND r.status IN ('allocated', 'preempting'))
SELECT jsonb_build_object(
    'earmarks', (SELECT count(*) FROM respool.requests
                  WHERE earmark_pool_id = (SELECT id FROM pool) AND status = 'queued'),
    'preempting', (SELECT count(*) FROM respool.requests
                    WHERE pool_id = (SELECT id FROM pool) AND status = 'preempting'),
    'fits_but_waits', coalesce((
        SELECT jsonb_agg(q.request_id::text) FROM respool.queue_entries q
         WHERE q.pool_id = (SELECT id FROM pool)
           AND EXISTS (SELECT FROM node_free f
                        WHERE f.free >= (q.resources ->> 'gpu')::bigint
                          AND respool._node_matches(f.name, f.labels, q.node_selector))),
        '[]'),
    'could_reclaim', coalesce((
        SELECT jsonb_agg(q.request_id::text || ' needs ' || (q.resources ->> 'gpu'))
          FROM respool.queue_entries q JOIN respool.policies p ON p.id = q.policy_id
         WHERE q.pool_id = (SELECT id FROM pool) AND p.subject = 'owner'
           AND (SELECT used FROM owner_used) + (q.resources ->> 'gpu')::bigint <= $2
           AND EXISTS (SELECT FROM node_free f
                        WHERE f.reclaimable >= (q.resources ->> 'gpu')::bigint
                          AND respool._node_matches(f.name, f.labels, q.node_selector))), '[]'))
"""


class EarmarkNodeMachine(DatabaseMachine):
    """Node changes during grace periods (see the block comment above)."""

    def __init__(self) -> None:
        super().__init__()
        self.tick = 0
        self.started = False
        self.nodes: dict[str, str] = {}  # node -> pool it is in (EPOOL or ESIDE)
        self.capacity: dict[str, int] = {}

    def now(self, step: int = 1) -> datetime:
        self.tick += step
        return CLOCK0 + timedelta(seconds=self.tick)

    def try_sql(self, query: str, *args: Any) -> bool:
        """Runs a node change; a 409 (reserved shares would no longer fit) changes nothing."""
        try:
            self.sql(query, *args)
        except asyncpg.PostgresError as e:
            if e.sqlstate != "RP409":
                raise
            self.stats["refused_409"] += 1
            return False
        return True

    @initialize(placement=st.sampled_from(["pack", "spread"]))
    def setup(self, placement: str) -> None:
        self.wipe()
        for name, grace in ((EPOOL, EGRACE), (ESIDE, 0)):
            self.sql(
                "SELECT respool.create_pool(p_name => $1, p_placement => $2,"
                " p_preemption_grace_seconds => $3, p_starvation_seconds => NULL, p_now => $4)",
                name,
                placement,
                grace,
                self.now(),
            )
        for name in ENODES:
            self._add_node(name)
        for subject, priority, reserved in (
            ("owner", 0, {"gpu": OWNER_SHARE}),
            ("b1", 1, {}),
            ("b2", 2, {}),
        ):
            self.sql(
                "SELECT respool.create_policy(p_subject => $1, p_pool => $2, p_priority => $3,"
                " p_reserved => $4, p_now => $5)",
                subject,
                EPOOL,
                priority,
                reserved,
                self.now(),
            )
        # A full pool of borrowers to start from: the owner's first request reclaims.
        for _ in ENODES:
            self._create("b1", EGPUS, 1, {})
        self.started = True

    # rules ---------------------------------------------------------------------------------------

    @precondition(lambda self: self.started)
    @rule(
        subject=st.sampled_from(["owner", "b1", "b1", "b2"]),
        gpu=st.sampled_from([1, 2, 2, 3, 4]),
        retries=st.sampled_from([0, 0, 1]),
        selector=st.sampled_from([{}, {}, {}, {"node": "m1"}, {"node": "m2"}]),
    )
    def create(self, subject: str, gpu: int, retries: int, selector: dict[str, str]) -> None:
        self._create(subject, gpu, retries, selector)

    @precondition(lambda self: self.started)
    @rule(
        subject=st.sampled_from(["owner", "owner", "b1", "b2"]),
        gpu=st.sampled_from([1, 2, 4]),
        retries=st.sampled_from([0, 1]),
    )
    def create_more(self, subject: str, gpu: int, retries: int) -> None:
        self._create(subject, gpu, retries, {})

    @precondition(lambda self: self.started)
    @rule(gpu=st.sampled_from([2, 3, 4]))
    def create_owner(self, gpu: int) -> None:
        self._create("owner", gpu, 0, {})

    def _create(self, subject: str, gpu: int, retries: int, selector: dict[str, str]) -> None:
        body: dict[str, Any] = {
            "subject": subject,
            "pool": EPOOL,
            "resources": {"gpu": gpu},
            "max_retries": retries,
        }
        if selector:
            body["node_selector"] = selector
        self.sql("SELECT request FROM respool.create_request($1, p_now => $2)", body, self.now())
        self.stats[f"create_{subject}"] += 1

    def _ids(self, statuses: tuple[str, ...]) -> list[str]:
        rows = self.runner.run(
            self.conn.fetch(
                "SELECT id::text FROM respool.requests WHERE status = ANY ($1::text[])"
                " ORDER BY created_at, id",
                list(statuses),
            )
        )
        return [r["id"] for r in rows]

    @precondition(lambda self: self.started)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ids = self._ids(("allocated", "preempting"))
        if not ids:
            return
        rid = data.draw(st.sampled_from(ids))
        self.sql("SELECT respool.release_request(p_id => $1::uuid, p_now => $2)", rid, self.now())
        self.stats["release"] += 1

    @precondition(lambda self: self.started)
    @rule()
    def reconcile(self) -> None:
        self.reconcile_pool(EPOOL, self.now())
        self.stats["reconcile"] += 1

    @precondition(lambda self: self.started)
    @rule()
    def grace_passes(self) -> None:
        """The clock passes a grace deadline, then one pass."""
        self.reconcile_pool(EPOOL, self.now(EGRACE + 1))
        self.stats["grace_passes"] += 1

    def _add_node(self, name: str) -> None:
        """Node ``name`` of EGPUS anonymous GPUs joins EPOOL."""
        body = {"name": name, "pool": EPOOL, "capacity": {"gpu": EGPUS}}
        self.sql("SELECT respool.create_node($1, p_now => $2)", body, self.now())
        self.nodes[name] = EPOOL
        self.capacity[name] = EGPUS

    def _in_pool(self) -> list[str]:
        return sorted(n for n, p in self.nodes.items() if p == EPOOL)

    @precondition(lambda self: self.started)
    @rule(data=st.data(), state=st.sampled_from(["cordoned", "draining", "active"]))
    def set_state(self, data: st.DataObject, state: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.nodes)))
        self.sql("SELECT respool.set_node_state($1, $2, p_now => $3)", name, state, self.now())
        self.stats[f"state_{state}"] += 1

    @precondition(lambda self: self.started)
    @rule(data=st.data())
    def delete_or_rejoin(self, data: st.DataObject) -> None:
        """Deletes a node with force (while another stays), or registers a deleted one again."""
        gone = sorted(set(ENODES) - set(self.nodes))
        if gone and data.draw(st.booleans()):
            name = gone[0]
            self._add_node(name)
            self.stats["rejoin"] += 1
            return
        if len(self._in_pool()) < 2:
            return
        name = data.draw(st.sampled_from(self._in_pool()))
        if self.try_sql("SELECT respool.delete_node($1, true, $2)", name, self.now()):
            del self.nodes[name]
            del self.capacity[name]
            self.stats["delete"] += 1

    @precondition(lambda self: self.started)
    @rule(data=st.data())
    def move(self, data: st.DataObject) -> None:
        """Moves a node to the side pool with force, or back."""
        name = data.draw(st.sampled_from(sorted(self.nodes)))
        to = ESIDE if self.nodes[name] == EPOOL else EPOOL
        if to == ESIDE and len(self._in_pool()) < 2:
            return
        if self.try_sql(
            "SELECT respool.update_node($1, $2, true, $3)", name, {"pool": to}, self.now()
        ):
            self.nodes[name] = to
            self.stats[f"move_to_{to}"] += 1

    @precondition(lambda self: self.started)
    @rule(data=st.data(), gpu=st.sampled_from([1, 2, 3, 4, 4, 6]))
    def resize(self, data: st.DataObject, gpu: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.nodes)))
        if self.try_sql(
            "SELECT respool.update_node($1, $2, p_now => $3)",
            name,
            {"capacity": {"gpu": gpu}},
            self.now(),
        ):
            self.capacity[name] = gpu
            self.stats["resize"] += 1

    @precondition(lambda self: self.started)
    @rule(
        data=st.data(),
        change=st.sampled_from(["cordoned", "draining", "delete", "move", "shrink"]),
    )
    def change_earmarked_node(self, data: st.DataObject, change: str) -> None:
        """The hard case on purpose: a reconciler pass, then a change to a node an earmark
        holds while its victims are in their grace period."""
        self.reconcile()
        names = self.runner.run(
            self.conn.fetch(
                "SELECT DISTINCT n.name FROM respool.requests r"
                " JOIN respool.nodes n ON n.id = r.earmark_node_id"
                " WHERE r.status = 'queued' ORDER BY n.name"
            )
        )
        if not names:
            return
        name = data.draw(st.sampled_from([r["name"] for r in names]))
        now = self.now()
        if change in ("cordoned", "draining"):
            self.sql("SELECT respool.set_node_state($1, $2, p_now => $3)", name, change, now)
        elif change == "delete":
            if len(self._in_pool()) < 2 or not self.try_sql(
                "SELECT respool.delete_node($1, true, $2)", name, now
            ):
                return
            del self.nodes[name]
            del self.capacity[name]
        elif change == "move":
            if len(self._in_pool()) < 2 or not self.try_sql(
                "SELECT respool.update_node($1, $2, true, $3)", name, {"pool": ESIDE}, now
            ):
                return
            self.nodes[name] = ESIDE
        else:
            gpu = data.draw(st.sampled_from([1, 2]))
            if not self.try_sql(
                "SELECT respool.update_node($1, $2, p_now => $3)",
                name,
                {"capacity": {"gpu": gpu}},
                now,
            ):
                return
            self.capacity[name] = gpu
        self.stats[f"earmarked_{change}"] += 1

    @precondition(lambda self: self.started)
    @rule()
    def settle(self) -> None:
        """Nothing changes but time: grace periods pass, two passes after each, until a period
        changes nothing; then L1 on nodes. A chain of preemptions may take several periods (a
        borrower requeued takes an owner's units by priority, the owner takes them back by
        reclaim, ...), but it ends: each victim is requeued at most max_retries times."""
        for _ in range(SETTLE_PERIODS):
            self.now(EGRACE + 1)
            passes = [self.reconcile_pool(EPOOL, self.now()) for _ in range(2)]
            self.stats["reconcile"] += 2
            if not any(n for done in passes for key, n in done.items() if key != "pool"):
                break
        got = self.sql(_L1_SQL, EPOOL, OWNER_SHARE)
        assert got == {
            "earmarks": 0,
            "preempting": 0,
            "fits_but_waits": [],
            "could_reclaim": [],
        }, got
        self.stats["settled"] += 1

    # checks --------------------------------------------------------------------------------------

    @invariant()
    def earmarks_follow_their_node(self) -> None:
        if not self.started:
            return
        stale = self.sql(_EARMARK_SQL, EPOOL)
        assert not stale, stale

    @invariant()
    def invariants_hold(self) -> None:
        if not self.started:
            return
        over = {
            r["name"]
            for r in self.runner.run(
                self.conn.fetch(
                    "SELECT DISTINCT n.name FROM respool.node_resources nr"
                    " JOIN respool.nodes n ON n.id = nr.node_id WHERE nr.used > nr.capacity"
                )
            )
        }
        rows = self.runner.run(self.conn.fetch("SELECT * FROM respool.invariant_violations"))
        assert [
            dict(v)
            for v in rows
            if not (v["invariant"] in ("I1", "I5") and over)  # a shrink not enforced yet
        ] == []
        assert node_violations(self, but_over=over) == []


# Node changes during a grace period never strand a request.
test_node_changes_during_grace_never_strand_a_request = model_test(
    EarmarkNodeMachine, "earmark node model test", quick=(10, 30), full=(80, 50)
)
