"""Model-based test of shared devices: the SQL engine against a small pure-Python reference of
slices (docs/placement.md, "Sharing a GPU"), written from the contract's words.

A Hypothesis ``RuleBasedStateMachine`` drives one pool (``pack`` or ``spread``, ``best_effort``)
backed by three nodes: ``a`` (two shared gpus of 40000 MiB, mps, and 8000 mcpu), ``b`` (three
shared gpus of 24000 MiB keeping 1000 back, time-slicing) and ``c`` (one gpu, whole only). It
creates slices (memory, sometimes a share, sometimes mcpu, sometimes a node selector; some no
device could ever hold) and whole requests, releases and cancels, cordons, drains and uncordons
nodes, and runs reconciler passes. After every step each request's status (with its reason), the
node, devices and slices it holds, every device's slice counters and whole holder, and the node
and pool counters must equal the model's, and ``respool.invariant_violations`` (I1-I9) must be
empty.

The model (this file only):
* a shared device offers its memory less what it keeps back, and a share of 100; the node and
  the pool count per shared key ``gpu_memory_mb`` and ``gpu_share``: the slices, and a whole
  device's whole offer and 100;
* rejection at creation: ``no_fitting_node`` when no node of the pool (any state) matching the
  selector could ever hold it: for a slice a shared device whose offer holds its memory (and a
  node whose mcpu, if it counts mcpu, holds its mcpu); for whole devices as many devices;
* admission (one priority, no reserved share, so queue order is queue time and ``best_effort``
  grants every entry that fits, in order, at every trigger): an ``active`` node matching the
  selector, with room for its mcpu, and a device for the slice (no whole holder, memory and share
  within the offer) or as many devices with neither a holder nor a slice;
* choice: ``pack`` takes the node whose best device is left with the least free memory once the
  slice is placed (whole devices: the fewest such devices left), then the fewest free units over
  the request's keys the node counts, then the name; ``spread`` the most; on the node, the slice
  goes on that device (ties: list order), whole devices are the first free ones in list order;
* reconcile (grace 0, one priority: nothing preempts for the queue): a draining node loses every
  holder (``node_drain``, no retries: terminal), then a pass.

``RESPOOL_MODEL_TWIN=broken_slice_twin`` installs a known-bad engine first: the test must then
fail (a slice lands on a device held whole: I9).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from support.model import NodeModelMachine, model_test

CLOCK0 = datetime(2033, 1, 1, tzinfo=UTC)
POOL = "sp"

# name -> (gpu ids, sharing mode or None, device memory, reserved, mcpu or None)
NODES: dict[str, tuple[list[str], str | None, int, int, int | None]] = {
    "a": (["0", "1"], "mps", 40000, 0, 8000),
    "b": (["x", "y", "z"], "time-slicing", 24000, 1000, None),
    "c": (["p"], None, 16000, 0, None),
}
SELECTORS: list[dict[str, str]] = [{}, {}, {}, {"node": "a"}, {"node": "b"}, {"node": "c"}]


@dataclass
class MDevice:
    id: str
    offer: int  # 0: not shared
    memory: int = 0
    share: int = 0
    holder: str | None = None

    def untouched(self) -> bool:
        return self.holder is None and self.memory == 0 and self.share == 0

    def takes(self, memory: int, share: int) -> bool:
        return (
            self.offer > 0
            and self.holder is None
            and self.memory + memory <= self.offer
            and self.share + share <= 100
        )


@dataclass
class MNode:
    name: str
    mode: str | None
    devices: list[MDevice]
    mcpu: int | None
    state: str = "active"
    mcpu_used: int = 0

    def counters(self) -> dict[str, int]:
        """The node's counters now: gpu (whole devices), and for a shared node its slice keys."""
        out = {"gpu": sum(d.holder is not None for d in self.devices)}
        if self.mode:
            out["gpu_memory_mb"] = sum(
                d.memory + (d.offer if d.holder else 0) for d in self.devices
            )
            out["gpu_share"] = sum(d.share + (100 if d.holder else 0) for d in self.devices)
        if self.mcpu is not None:
            out["mcpu"] = self.mcpu_used
        return out

    def capacity(self) -> dict[str, int]:
        out = {"gpu": len(self.devices)}
        if self.mode:
            out["gpu_memory_mb"] = sum(d.offer for d in self.devices)
            out["gpu_share"] = 100 * len(self.devices)
        if self.mcpu is not None:
            out["mcpu"] = self.mcpu
        return out


@dataclass
class MRequest:
    id: str
    seq: int
    memory: int  # a slice's memory (0: whole devices)
    share: int  # 0: none asked
    gpus: int  # whole devices (0: a slice)
    mcpu: int
    selector: dict[str, str]
    status: str = "queued"
    reason: str | None = None
    node: str | None = None
    devices: list[str] = field(default_factory=list)

    def resources(self) -> dict[str, int]:
        out = {"gpu_memory_mb": self.memory, "gpu_share": self.share, "gpu": self.gpus}
        out |= {"mcpu": self.mcpu}
        return {k: v for k, v in out.items() if v}


class Model:
    def __init__(self, placement: str) -> None:
        self.placement = placement
        self.nodes: dict[str, MNode] = {}
        self.requests: dict[str, MRequest] = {}
        self.stats: Counter[str] = Counter()
        self.now = 0

    def matching(self, r: MRequest) -> list[MNode]:
        return [n for n in self.nodes.values() if all(n.name == v for v in r.selector.values())]

    def could_hold(self, n: MNode, r: MRequest) -> bool:
        if n.mcpu is not None and r.mcpu > n.mcpu:
            return False
        if r.gpus:
            return len(n.devices) >= r.gpus
        return any(d.offer >= r.memory for d in n.devices)

    def fits(self, n: MNode, r: MRequest) -> list[MDevice] | None:
        """The devices ``r`` takes on ``n`` now (placement order), None when it does not fit."""
        if n.state != "active" or (n.mcpu is not None and n.mcpu_used + r.mcpu > n.mcpu):
            return None
        if r.gpus:
            free = [d for d in n.devices if d.untouched()]
            return free[: r.gpus] if len(free) >= r.gpus else None
        fitting = [d for d in n.devices if d.takes(r.memory, r.share)]
        if not fitting:
            return None
        sign = 1 if self.placement == "pack" else -1
        order = sorted(
            enumerate(fitting), key=lambda x: (sign * (x[1].offer - x[1].memory - r.memory), x[0])
        )
        return [order[0][1]]

    def sort_key(self, n: MNode, r: MRequest, devices: list[MDevice]) -> tuple[Any, ...]:
        sign = 1 if self.placement == "pack" else -1
        if r.gpus:
            first = 0
            second = sign * (sum(d.untouched() for d in n.devices) - r.gpus)
        else:
            first = sign * (devices[0].offer - devices[0].memory - r.memory)
            second = 0
        free, cap = n.counters(), n.capacity()
        need = r.resources()
        third = sum(cap[k] - free[k] - v for k, v in need.items() if k in cap)
        return (first, second, sign * third, n.name)

    def try_grant(self, r: MRequest) -> bool:
        options = []
        for n in self.matching(r):
            devices = self.fits(n, r)
            if devices is not None:
                options.append((self.sort_key(n, r, devices), n, devices))
        if not options:
            return False
        _, node, devices = min(options, key=lambda o: o[0])
        r.status, r.node = "allocated", node.name
        r.devices = [d.id for d in devices]
        node.mcpu_used += r.mcpu if node.mcpu is not None else 0
        for d in devices:
            if r.gpus:
                d.holder = r.id
            else:
                d.memory += r.memory
                d.share += r.share
        self.stats["granted_slice" if r.memory else "granted_whole"] += 1
        return True

    def unplace(self, r: MRequest) -> None:
        node = self.nodes[r.node] if r.node else None
        if node is not None:
            node.mcpu_used -= r.mcpu if node.mcpu is not None else 0
            for d in node.devices:
                if d.id in r.devices:
                    if r.gpus:
                        d.holder = None
                    else:
                        d.memory -= r.memory
                        d.share -= r.share
        r.node, r.devices = None, []

    def settle(self) -> None:
        """After a node changes state: grant what now fits."""
        self.allocate()

    def allocate(self) -> None:
        for r in sorted(self.requests.values(), key=lambda r: r.seq):
            if r.status == "queued":
                self.try_grant(r)

    def create(self, r: MRequest) -> None:
        self.requests[r.id] = r
        if not any(self.could_hold(n, r) for n in self.matching(r)):
            r.status, r.reason = "rejected", "no_fitting_node"
            self.stats["rejected"] += 1
            return
        self.allocate()

    def finish(self, r: MRequest, status: str) -> None:
        if r.status == "allocated":
            self.unplace(r)
        r.status, r.reason = status, ("cancelled" if status == "cancelled" else None)
        self.allocate()

    def reconcile(self) -> None:
        for n in sorted(self.nodes.values(), key=lambda n: n.name):
            if n.state != "draining":
                continue
            for r in self.requests.values():
                if r.status == "allocated" and r.node == n.name:
                    self.unplace(r)
                    r.status, r.reason = "preempted", "node_drain"
                    self.stats["drained"] += 1
        self.allocate()

    def pool_used(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for n in self.nodes.values():
            total.update({k: v for k, v in n.counters().items() if k != "mcpu"})
        for r in self.requests.values():
            if r.status == "allocated":
                total["mcpu"] += r.mcpu
                total["step_run"] += 1
        return {k: v for k, v in total.items() if v}


_STATE_SQL = """
SELECT jsonb_build_object(
    'requests', coalesce((SELECT jsonb_object_agg(r.id::text, jsonb_build_array(
                    r.status, r.reason, d.doc -> 'placement' ->> 'node',
                    coalesce(d.doc -> 'placement' -> 'devices' -> 'gpu', '[]'),
                    coalesce(d.doc -> 'placement' -> 'slices', '{}')))
                  FROM respool.requests r
                 CROSS JOIN LATERAL (SELECT respool.get_request(r.id) AS doc) d), '{}'),
    'devices', coalesce((SELECT jsonb_object_agg(n.name || '/' || nd.device,
                    jsonb_build_array(nd.memory_used, nd.share_used, nd.holder_id::text))
                  FROM respool.node_devices nd JOIN respool.nodes n ON n.id = nd.node_id), '{}'),
    'node_used', coalesce((SELECT jsonb_object_agg(n.name || '/' || nr.key, nr.used)
                  FROM respool.node_resources nr JOIN respool.nodes n ON n.id = nr.node_id), '{}'),
    'pool_used', coalesce((SELECT jsonb_object_agg(pr.key, pr.used) FROM respool.pool_resources pr
                  WHERE pr.used <> 0), '{}'),
    'violations', coalesce((SELECT jsonb_agg(v.invariant || ' ' || v.detail)
                  FROM respool.invariant_violations v), '[]'))
"""


class SharedMachine(NodeModelMachine):
    clock0 = CLOCK0
    pool = POOL

    def __init__(self) -> None:
        super().__init__()
        self.model = Model("pack")
        self.started = False

    @initialize(placement=st.sampled_from(["pack", "spread"]))
    def setup(self, placement: str) -> None:
        self.wipe()
        self.model = Model(placement)
        self.sql(
            "SELECT respool.create_pool(p_name => $1, p_placement => $2,"
            " p_starvation_seconds => NULL, p_now => $3)",
            POOL,
            placement,
            self.now(),
        )
        self.sql(
            "SELECT respool.create_policy(p_subject => 's', p_pool => $1, p_now => $2)",
            POOL,
            self.now(),
        )
        for name, (ids, mode, memory, reserved, mcpu) in NODES.items():
            body: dict[str, Any] = {"name": name, "pool": POOL, "devices": {"gpu": ids}}
            if mode:
                body |= {
                    "sharing": {"gpu": mode},
                    "device_memory_mb": {"gpu": memory},
                    "reserved_memory_mb": {"gpu": reserved},
                }
            if mcpu is not None:
                body["capacity"] = {"mcpu": mcpu}
            self.sql("SELECT respool.create_node($1, p_now => $2)", body, self.now())
            offer = memory - reserved if mode else 0
            self.model.nodes[name] = MNode(name, mode, [MDevice(i, offer) for i in ids], mcpu)
        self.started = True

    def _create(self, r: MRequest) -> None:
        body: dict[str, Any] = {"subject": "s", "pool": POOL, "resources": r.resources()}
        if r.selector:
            body["node_selector"] = r.selector
        doc = self.sql(
            "SELECT request FROM respool.create_request($1, p_now => $2)", body, self.now()
        )
        r.id = doc["id"]
        r.seq = self.seq
        self.model.create(r)

    @precondition(lambda self: self.started)
    @rule(
        memory=st.sampled_from([1000, 8000, 15000, 15000, 23000, 30000, 45000]),
        share=st.sampled_from([0, 0, 10, 30, 60]),
        mcpu=st.sampled_from([0, 0, 0, 3000]),
        selector=st.sampled_from(SELECTORS),
    )
    def create_slice(self, memory: int, share: int, mcpu: int, selector: dict[str, str]) -> None:
        self._create(MRequest("", 0, memory, share, 0, mcpu, dict(selector)))
        self.stats["create_slice"] += 1

    @precondition(lambda self: self.started)
    @rule(gpus=st.sampled_from([1, 1, 2, 3]), selector=st.sampled_from(SELECTORS))
    def create_whole(self, gpus: int, selector: dict[str, str]) -> None:
        self._create(MRequest("", 0, 0, 0, gpus, 0, dict(selector)))
        self.stats["create_whole"] += 1

    state_sql = _STATE_SQL

    def model_requests(self) -> dict[str, Any]:
        model: dict[str, Any] = {}
        for r in self.model.requests.values():
            slices = (
                {
                    "gpu": {
                        r.devices[0]: {"memory_mb": r.memory}
                        | ({"share": r.share} if r.share else {})
                    }
                }
                if r.node and not r.gpus
                else {}
            )
            model[r.id] = [r.status, r.reason, r.node, r.devices, slices]
        return model

    def check_state(self, state: dict[str, Any]) -> None:
        devices = {
            f"{n.name}/{d.id}": [d.memory, d.share, d.holder]
            for n in self.model.nodes.values()
            for d in n.devices
        }
        assert state["devices"] == devices
        node_used = {
            f"{n.name}/{k}": v for n in self.model.nodes.values() for k, v in n.counters().items()
        }
        assert state["node_used"] == node_used
        assert state["pool_used"] == self.model.pool_used()
        assert state["violations"] == []

    def _diff(self, engine: dict[str, Any], model: dict[str, Any]) -> str:
        lines = [f"placement {self.model.placement}"]
        for n in self.model.nodes.values():
            lines.append(f"  node {n.name} {n.state} {n.counters()} devices {n.devices}")
        for r in sorted(self.model.requests.values(), key=lambda r: r.seq):
            mark = "  " if engine.get(r.id) == model.get(r.id) else "!!"
            lines.append(
                f"{mark} #{r.seq} {r.resources()} sel={r.selector}:"
                f" engine {engine.get(r.id)} model {model.get(r.id)}"
            )
        return "\n".join(lines)


test_engine_matches_shared_device_model = model_test(
    SharedMachine, "shared device model test", quick=(10, 25)
)
