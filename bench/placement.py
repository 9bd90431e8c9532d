"""Scenario ``placement``: pools backed by nodes (docs/placement.md), three figures.

1. **cycles**: create → allocated → release cycles of one-GPU requests, driven by pgbench as in
   ``python -m bench cycles``, on a pool of ``--nodes`` nodes × 8 GPUs (named
   devices "0".."7") and on an abstract pool of as many GPUs, the same subjects with a policy on
   both, in one database. Runs alternate (abstract, nodes) per client count so that load drift
   touches both; the figure is requests/s and the ratio nodes ÷ abstract. Every cycle checks its
   own grant (allocated at create; placed on a node in the node pool, never in the other), and
   after each run every request must be released, every node counter back at 0, no device held.
2. **fragmentation**: a saturated trace of 1/2/4/8-GPU jobs (weights 40/30/20/10 %, hold times
   uniform in 5–120 minutes, seeded) on ``--frag-nodes`` nodes × 8 GPUs, under ``pack`` and under
   ``spread``, next to an abstract pool of the same GPUs (no fragmentation possible: the
   reference). The clock is simulated: every engine call gets ``p_now`` (create, release), so the
   run replays hours of work in seconds of wall time and every figure is exact (no timer noise).
   The queue is kept at ``--queue-depth`` waiting jobs (a closed system: a job is submitted
   whenever one leaves the queue) until the trace is used up; the measured window ends there.
   Figures: the share of GPU-time busy; fragmentation events (after each change, the queued jobs
   that wait although the pool has enough free GPUs in total), the jobs that ever saw one, and
   the GPU-time left free while such a job waited; waits per job size.
3. **preemption**: ``--nodes`` × 8 GPUs full of preemptible one-, two- and four-GPU borrowers
   of four low-priority subjects (no reserved share); a subject with a reserved share asks for
   ``--preempt-gpus`` GPUs, non-preemptible (in share): it queues, and one
   ``respool.reconcile_pool`` pass (one transaction, timed by the client) preempts the minimal
   victim set on one node and grants it. Then it is released and its victims replaced, and the
   next pass is timed; passes alternate with the same on an abstract pool of as many GPUs.
4. **slices**: shared GPUs (docs/placement.md, "Sharing a GPU"). A saturated mixed trace of
   slices (``gpu_memory_mb`` 10–40 GiB, a third with a ``gpu_share``) and whole-GPU jobs on
   ``--slice-nodes`` nodes × 8 A100 80 GB (sharing ``mps``), replayed on the simulated clock as
   in ``fragmentation``; then the same jobs asking whole GPUs only (a slice becomes ``gpu: 1``).
   Figures: held GPU memory × time ÷ (offered memory × the window), the mean number of jobs
   running at once and its ratio to whole GPUs only. Then cycles as in ``cycles``: slice grants
   (create granted at once + release) on a shared pool against whole-device grants on a pool of
   the same nodes without sharing (and whole devices on the shared pool), 1 and 8 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import heapq
import random
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

import asyncpg

from bench import common
from bench.common import DEFAULT_DSN, Figures, Spread, log, positive_ints, ratio, report
from bench.cycles import check_engine_run
from bench.wake import percentile

SUMMARY = (
    "placement on nodes: cycles against abstract units, fragmentation, node-aware preemption, "
    "shared GPUs (slices)"
)
SCENARIOS = ("cycles", "fragmentation", "preemption", "slices")
SEED = 24
SIZES = (1, 2, 4, 8)
WEIGHTS = (40, 30, 20, 10)
HOLD_S = (5 * 60, 120 * 60)  # uniform, seconds of simulated time
BORROWER_SIZES = (1, 2, 4)
TARGETS = {
    "cycles": 0.7, "busy": 0.9, "preemption_ms": 50.0, "slice_memory": 0.9, "slice_cycles": 0.8
}  # fmt: skip

# Pool names: bench-p0 is abstract, bench-p1 is backed by nodes (pgbench passes the digit).
POOL = {False: "bench-p0", True: "bench-p1"}

CYCLE_SQL = """\\set s random(1, :subjects)
SELECT c.request->>'id' AS rid FROM respool.create_request(jsonb_build_object(
    'subject', 'bench-s' || :s::text, 'pool', 'bench-p' || :nodes::text,
    'resources', '{"gpu": 1}'::jsonb, 'lease_seconds', 300)) c
 WHERE c.request->>'status' = 'allocated'
   AND coalesce(jsonb_typeof(c.request->'placement') = 'object', false) = (:nodes = 1) \\gset
SELECT respool.release_request(p_id => :rid::uuid) IS NOT NULL;
"""
# (\\gset refuses zero rows: a cycle that is not granted at once, or placed where it should not
# be, aborts its client and pgbench fails the run.)

NODE_STATE = """
SELECT (SELECT count(*) FROM respool.placements) AS placements,
       (SELECT count(*) FROM respool.node_resources WHERE used <> 0) AS counters,
       (SELECT count(*) FROM respool.node_devices WHERE holder_id IS NOT NULL) AS devices
"""

HOLDERS = """
SELECT coalesce(array_agg(r.id), '{}') AS ids,
       coalesce(sum((r.resources ->> 'gpu')::bigint), 0) AS gpus,
       (SELECT coalesce(sum(nr.used), 0) FROM respool.node_resources nr
          JOIN respool.nodes n ON n.id = nr.node_id
         WHERE n.pool_id = $1 AND nr.key = 'gpu') AS node_gpus
  FROM respool.requests r
 WHERE r.pool_id = $1 AND r.status = 'allocated'
"""


# --- setup -----------------------------------------------------------------------------------


async def make_pool(
    conn: asyncpg.Connection,
    name: str,
    *,
    nodes: int,
    gpus_per_node: int,
    placement: str = "pack",
    abstract: bool = False,
    starvation_seconds: int | None = 300,
) -> UUID:
    """A pool of ``nodes`` × ``gpus_per_node`` GPUs: abstract units, or nodes named
    ``<name>-n000``… with devices "0".."gpus_per_node-1" (``respool.create_node``)."""
    capacity = {"gpu": nodes * gpus_per_node} if abstract else {}
    doc = await conn.fetchval(
        "SELECT respool.create_pool(p_name => $1, p_capacity => $2, p_placement => $3,"
        "                           p_starvation_seconds => $4)",
        name,
        capacity,
        placement,
        starvation_seconds,
    )
    if not abstract:
        devices = [str(d) for d in range(gpus_per_node)]
        for i in range(nodes):
            await conn.execute(
                "SELECT respool.create_node($1::jsonb)",
                {"name": f"{name}-n{i:03d}", "pool": name, "devices": {"gpu": devices}},
            )
    got = await conn.fetchval(
        "SELECT capacity FROM respool.pool_resources WHERE pool_id = $1::uuid AND key = 'gpu'",
        doc["id"],
    )
    if got != nodes * gpus_per_node:
        raise SystemExit(f"placement: pool {name} has {got} GPUs, expected {nodes * gpus_per_node}")
    return UUID(doc["id"])


async def _create(
    conn: asyncpg.Connection, body: dict[str, Any], now: datetime.datetime | None = None
) -> dict[str, Any]:
    doc: dict[str, Any] = await conn.fetchval(
        "SELECT c.request FROM respool.create_request($1::jsonb, p_now => coalesce($2, now())) c",
        body,
        now,
    )
    return doc


async def _healthy(conn: asyncpg.Connection, what: str) -> None:
    bad = await common.broken_invariants(conn)
    if bad:
        raise SystemExit(f"placement: {what} left {bad} invariant violations")


# --- 1. cycles -------------------------------------------------------------------------------


@dataclass
class CycleFigures:
    clients: list[int]
    abstract: dict[int, Spread] = field(default_factory=dict)
    nodes: dict[int, Spread] = field(default_factory=dict)

    def ratio(self, clients: int) -> float:
        return ratio(self.nodes[clients], self.abstract[clients])

    def as_dict(self) -> dict[str, Any]:
        return {
            "abstract": {str(c): s.as_dict() for c, s in self.abstract.items()},
            "nodes": {str(c): s.as_dict() for c, s in self.nodes.items()},
            "nodes_over_abstract": {str(c): self.ratio(c) for c in self.clients},
        }


async def _check_cycles(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow(NODE_STATE)
    assert row is not None
    if any(row.values()):
        raise SystemExit(f"placement cycles left node state behind: {dict(row)}")
    await check_engine_run(conn)  # all released, each granted at create; then cleared
    await conn.execute("VACUUM ANALYZE respool.node_resources, respool.node_devices")


def _write_script(path: Path, text: str = CYCLE_SQL) -> Path:
    path.write_text(text)
    return path


async def measure_cycles(
    dsn: str, clients: list[int], seconds: float, repeats: int, nodes: int, gpn: int, subjects: int
) -> CycleFigures:
    pgbench = common.find_pgbench()
    samples: dict[bool, dict[int, list[float]]] = {False: {}, True: {}}
    conn = await common.bench_connect(dsn)
    try:
        for with_nodes in (False, True):
            await make_pool(
                conn, POOL[with_nodes], nodes=nodes, gpus_per_node=gpn, abstract=not with_nodes
            )
            for s in range(1, subjects + 1):
                await conn.execute(
                    "SELECT respool.create_policy(p_subject => $1, p_pool => $2)",
                    f"bench-s{s}",
                    POOL[with_nodes],
                )
        await conn.execute("VACUUM ANALYZE")
        with tempfile.TemporaryDirectory(prefix="respool-bench-") as tmp:
            script = _write_script(Path(tmp, "cycle.sql"))
            for rep in range(repeats):
                for c in clients:
                    for with_nodes in (False, True):
                        tps = await common.run_pgbench(
                            pgbench, dsn, script, clients=c, seconds=seconds,
                            defines={"subjects": str(subjects), "nodes": str(int(with_nodes))},
                        )  # fmt: skip
                        samples[with_nodes].setdefault(c, []).append(tps)
                        await _check_cycles(conn)
                        what = "nodes" if with_nodes else "abstract"
                        log(f"  placement cycles: {rep + 1}/{repeats} {what:8} {c:>2} clients"
                            f" {tps:,.0f}/s")  # fmt: skip
        await _healthy(conn, "cycles")
    finally:
        await conn.close()
    return CycleFigures(
        clients,
        abstract={c: Spread.of(v) for c, v in samples[False].items()},
        nodes={c: Spread.of(v) for c, v in samples[True].items()},
    )


# --- 2. fragmentation ------------------------------------------------------------------------


def trace(jobs: int, seed: int) -> list[tuple[int, float]]:
    """``jobs`` (GPUs, hold seconds), replayable."""
    rng = random.Random(seed)  # noqa: S311 - a replayable trace, not crypto
    return [(rng.choices(SIZES, WEIGHTS)[0], rng.uniform(*HOLD_S)) for _ in range(jobs)]


@dataclass
class _ReplayRun:
    """What every replay of a trace reports first: its mode, its size and how long it ran
    (:meth:`_Clock.run_fields`)."""

    mode: str
    gpus: int
    jobs: int
    simulated_hours: float
    wall_seconds: float


@dataclass
class FragFigures(_ReplayRun):
    # (its mode, a _ReplayRun field: pack | spread | abstract)
    busy_share: float
    fragmentation_events: int
    jobs_hit: int
    events_by_gpus: dict[int, int]
    jobs_hit_by_gpus: dict[int, int]
    stranded_share: float  # GPU-time free while a queued job would have fit in the free total
    granted: dict[int, int]
    wait_mean_min: dict[int, float | None]  # None: no job of that size was granted
    wait_p90_min: dict[int, float | None]
    queued_at_end: dict[int, int]

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for k in (
            "events_by_gpus",
            "jobs_hit_by_gpus",
            "granted",
            "wait_mean_min",
            "wait_p90_min",
            "queued_at_end",
        ):
            out[k] = {str(s): v for s, v in out[k].items()}
        return out


class _Replayed(Protocol):
    conn: asyncpg.Connection
    queued: Any
    ends: Any

    async def submit(self, *job: Any) -> None: ...
    async def settle(self) -> None: ...
    async def release_next(self) -> None: ...


async def _replay_trace(
    sim: _Replayed,
    todo: Iterator[tuple[Any, ...]],
    depth: int,
    what: str,
    mode: str,
    after_release: Callable[[], Awaitable[None]],
) -> float:
    """Replays a trace on a simulated clock: keeps ``depth`` jobs waiting, and at each step
    ends the holding that ends first, settles (``after_release``), tops the queue up and settles
    again, until the trace is exhausted; then checks the invariants. Returns the wall-clock
    seconds of the replay."""

    async def top_up() -> bool:
        while len(sim.queued) < depth:
            job = next(todo, None)
            if job is None:
                return False
            await sim.submit(*job)
        return True

    started = time.perf_counter()
    more = await top_up()
    await sim.settle()
    while more:
        if not sim.ends:
            raise SystemExit(f"placement {what}: nothing runs and the queue is stuck")
        await sim.release_next()
        await after_release()
        more = await top_up()
        await sim.settle()
    wall = time.perf_counter() - started
    await _healthy(sim.conn, f"{what} ({mode})")
    return wall


class _Clock:
    """What both replays share: a simulated clock from t0 (jobs submitted at one instant a
    ``burst`` of microseconds apart) and the releases, earliest end first."""

    what = ""  # "placement <scenario>", for the errors
    # set by each replay: its pool, GPUs and books (a job is two fields, as _start takes them)
    pool_id: UUID
    gpus: int
    running: dict[UUID, Any]
    queued: dict[UUID, tuple[Any, Any, float]]  # id -> (the job, queued at)

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.t0 = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        self.t = 0.0  # simulated seconds since t0
        self.burst = 0  # jobs submitted at this instant
        self.ends: list[tuple[float, UUID]] = []

    def now(self) -> datetime.datetime:
        return self.t0 + datetime.timedelta(seconds=self.t)

    def run_fields(self, mode: str, jobs: int, wall: float) -> dict[str, Any]:
        """The :class:`_ReplayRun` fields of this replay of ``jobs`` jobs, which took ``wall``
        seconds."""
        return {
            "mode": mode,
            "gpus": self.gpus,
            "jobs": jobs,
            "simulated_hours": self.t / 3600,
            "wall_seconds": wall,
        }

    def advance(self, to: float) -> None:
        raise NotImplementedError

    def _start(self, rid: UUID, job: Any, more: Any, waited: float) -> None:
        raise NotImplementedError

    async def _granted(self, holders: str) -> asyncpg.Record:
        """Start every job the engine granted at this instant (``holders``: the query of the
        pool's holders, ``ids``, and its counters) and check that the engine's holders are the
        replay's; the row of ``holders``."""
        row = await self.conn.fetchrow(holders, self.pool_id)
        assert row is not None
        holding = set(row["ids"])
        for rid in holding - self.running.keys():
            job, more, queued_at = self.queued.pop(rid)
            self._start(rid, job, more, self.t - queued_at)
        if holding != self.running.keys():
            raise SystemExit(f"{self.what}: the engine's holders differ from the replay")
        return row

    async def _submit(self, body: dict[str, Any], job: str) -> tuple[UUID, bool]:
        """Create ``body`` (``job`` names it in an error) now; return its id and whether it
        queued (else it was allocated). Jobs submitted at one instant are a microsecond apart,
        so that the queue's order (and so the whole replay) is the trace's order, not that of
        their random ids."""
        at = self.now() + datetime.timedelta(microseconds=self.burst)
        self.burst += 1
        doc = await _create(self.conn, body, at)
        if doc["status"] not in ("allocated", "queued"):
            raise SystemExit(f"{self.what}: {job} is {doc['status']}: {doc}")
        return UUID(doc["id"]), doc["status"] == "queued"

    async def _release_first(self) -> UUID:
        """Move the clock to the earliest end and release that job; return its id."""
        end, rid = heapq.heappop(self.ends)
        self.advance(end)
        doc = await self.conn.fetchval(
            "SELECT respool.release_request(p_id => $1, p_now => $2)", rid, self.now()
        )
        if doc["status"] != "released":
            raise SystemExit(f"{self.what}: a release answered {doc['status']}")
        return rid


class _Sim(_Clock):
    """One replay of the trace on one pool, with the engine deciding every grant."""

    what = "placement fragmentation"

    def __init__(
        self, conn: asyncpg.Connection, pool: str, pool_id: UUID, gpus: int, nodes: bool
    ) -> None:
        super().__init__(conn)
        self.pool, self.pool_id, self.gpus, self.nodes = pool, pool_id, gpus, nodes
        self.running: dict[UUID, int] = {}  # id -> GPUs
        self.queued: dict[UUID, tuple[int, float, float]] = {}  # id -> (GPUs, hold, queued at)
        self.busy = 0
        self.busy_gpu_s = 0.0
        self.stranded_gpu_s = 0.0
        self.events: Counter[int] = Counter()  # GPUs -> jobs × instants
        self.hit: dict[UUID, int] = {}  # id -> GPUs
        self.waits: dict[int, list[float]] = {s: [] for s in SIZES}

    def _start(self, rid: UUID, gpus: int, hold: float, waited: float) -> None:
        self.running[rid] = gpus
        self.busy += gpus
        heapq.heappush(self.ends, (self.t + hold, rid))
        self.waits[gpus].append(waited / 60)

    async def submit(self, gpus: int, hold: float) -> None:
        body = {"subject": "frag", "pool": self.pool, "resources": {"gpu": gpus}}
        rid, queued = await self._submit(body, f"a {gpus}-GPU job")
        if queued:
            self.queued[rid] = (gpus, hold, self.t)
        else:
            self._start(rid, gpus, hold, 0.0)

    async def settle(self, *, count: bool = True) -> None:
        """Learn what the engine granted at this instant and check the counters; then (once
        per instant, ``count``) count the jobs that wait although the free total holds them."""
        row = await self._granted(HOLDERS)
        if row["gpus"] != self.busy:
            raise SystemExit(f"{self.what}: the engine's holders differ from the replay")
        if self.nodes and row["node_gpus"] != self.busy:
            raise SystemExit(
                f"placement fragmentation: node counters say {row['node_gpus']} GPUs in use, "
                f"the holders {self.busy}"
            )
        if not count:
            return
        free = self.gpus - self.busy
        for rid, (g, _, _) in self.queued.items():
            if g <= free:
                self.events[g] += 1
                self.hit[rid] = g

    def advance(self, to: float) -> None:
        free = self.gpus - self.busy
        dt = to - self.t
        self.busy_gpu_s += self.busy * dt
        if any(g <= free for g, _, _ in self.queued.values()):
            self.stranded_gpu_s += free * dt
        self.t = to
        self.burst = 0

    async def release_next(self) -> None:
        self.busy -= self.running.pop(await self._release_first())


async def _replay(
    dsn: str, mode: str, jobs: list[tuple[int, float]], nodes: int, depth: int, starve: int | None
) -> FragFigures:
    gpn = 8
    conn = await common.bench_connect(dsn)
    try:
        pool = f"frag-{mode}"
        pool_id = await make_pool(
            conn, pool, nodes=nodes, gpus_per_node=gpn, abstract=mode == "abstract",
            placement="pack" if mode == "abstract" else mode, starvation_seconds=starve,
        )  # fmt: skip
        await conn.execute("SELECT respool.create_policy(p_subject => 'frag', p_pool => $1)", pool)
        sim = _Sim(conn, pool, pool_id, nodes * gpn, mode != "abstract")
        # (after a release the instant is not over: its waits are counted at the next settle)
        wall = await _replay_trace(
            sim, iter(jobs), depth, "fragmentation", mode, lambda: sim.settle(count=False)
        )
    finally:
        await conn.close()
    span = sim.t * sim.gpus or float("nan")
    figures = FragFigures(
        **sim.run_fields(mode, len(jobs), wall),
        busy_share=sim.busy_gpu_s / span,
        fragmentation_events=sum(sim.events.values()),
        jobs_hit=len(sim.hit),
        events_by_gpus={g: sim.events[g] for g in SIZES},
        jobs_hit_by_gpus={g: Counter(sim.hit.values())[g] for g in SIZES},
        stranded_share=sim.stranded_gpu_s / span,
        granted={s: len(w) for s, w in sim.waits.items()},
        wait_mean_min={s: sum(w) / len(w) if w else None for s, w in sim.waits.items()},
        wait_p90_min={s: percentile(w, 90) if w else None for s, w in sim.waits.items()},
        queued_at_end=dict(sorted(Counter(g for g, _, _ in sim.queued.values()).items())),
    )
    log(
        f"  placement fragmentation: {mode:8} busy {figures.busy_share:.1%}, "
        f"{figures.fragmentation_events:,} fragmentation events ({figures.jobs_hit} jobs), "
        f"{figures.simulated_hours:.0f} h simulated in {wall:.1f} s"
    )
    return figures


async def measure_fragmentation(
    admin_dsn: str, jobs: int, nodes: int, depth: int, seed: int, starve: int | None
) -> dict[str, FragFigures]:
    work = trace(jobs, seed)
    out = {}
    for mode in ("pack", "spread", "abstract"):
        async with common.fresh_database(admin_dsn) as dsn:
            out[mode] = await _replay(dsn, mode, work, nodes, depth, starve)
    return out


# --- 3. preemption ---------------------------------------------------------------------------


@dataclass
class PreemptFigures:
    nodes: int
    gpus: int
    wanted: int
    passes: int
    node_ms: Spread
    abstract_ms: Spread
    node_victims: Spread
    abstract_victims: Spread

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodes": self.nodes, "gpus": self.gpus, "wanted": self.wanted}
        out["passes"] = self.passes
        for name in ("node", "abstract"):
            ms: Spread = getattr(self, f"{name}_ms")
            out[f"{name}_p50_ms"] = percentile(ms.values, 50)
            out[f"{name}_p90_ms"] = percentile(ms.values, 90)
            out[f"{name}_ms"] = ms.as_dict()
            out[f"{name}_victims"] = getattr(self, f"{name}_victims").as_dict()
        return out


async def _fill(conn: asyncpg.Connection, pool: str, gpus: int, rng: random.Random) -> None:
    """Borrowers of subjects low-0..low-3 until the pool is full: sizes 1/2/4 (seeded) while
    one fits, a one-GPU borrower where a larger one would have to wait (cancelled)."""
    free = gpus
    i = 0
    while free:
        size = min(rng.choice(BORROWER_SIZES), free)
        body = {"subject": f"low-{i % 4}", "pool": pool, "lease_seconds": 3600}
        doc = await _create(conn, {**body, "resources": {"gpu": size}})
        if doc["status"] == "queued" and size > 1:  # it fits the free total, no node
            await conn.fetchval("SELECT respool.cancel_request($1)", UUID(doc["id"]))
            doc = await _create(conn, {**body, "resources": {"gpu": 1}})
        if doc["status"] != "allocated":
            raise SystemExit(f"placement preemption: a borrower is {doc['status']}: {doc}")
        free -= int(doc["resources"]["gpu"])
        i += 1


async def _one_pass(
    conn: asyncpg.Connection, pool: str, pool_id: UUID, wanted: int, seen: set[UUID]
) -> tuple[float, int]:
    """The in-share request arrives, one pass preempts for it; then it is released and its
    victims replaced by borrowers of the same subjects and sizes. Returns (ms, victims)."""
    doc = await _create(
        conn,
        {"subject": "high", "pool": pool, "resources": {"gpu": wanted}, "preemptible": False,
         "lease_seconds": 3600},
    )  # fmt: skip
    if doc["status"] != "queued":
        raise SystemExit(f"placement preemption: the in-share request is {doc['status']}")
    rid = UUID(doc["id"])
    started = time.perf_counter()
    done = await conn.fetchval("SELECT respool.reconcile_pool($1)", pool_id)
    ms = (time.perf_counter() - started) * 1000
    got = await conn.fetchval("SELECT respool.request_json($1)", rid)
    if not done or done["preempted"] < 1 or got["status"] != "allocated":
        raise SystemExit(f"placement preemption: the pass did not preempt and grant: {done}, {got}")
    if (pool == POOL[True]) != bool(got.get("placement")):
        raise SystemExit(f"placement preemption: granted with placement {got.get('placement')}")
    victims = [
        v
        for v in await conn.fetch(
            "SELECT id, subject, resources FROM respool.requests"
            " WHERE pool_id = $1 AND status = 'preempted'",
            pool_id,
        )
        if v["id"] not in seen
    ]
    if len(victims) != done["preempted"]:
        raise SystemExit(f"placement preemption: {len(victims)} victims, the pass says {done}")
    seen.update(v["id"] for v in victims)
    await conn.fetchval("SELECT respool.release_request($1)", rid)
    for v in victims:
        again = await _create(
            conn,
            {"subject": v["subject"], "pool": pool, "resources": {"gpu": v["resources"]["gpu"]},
             "lease_seconds": 3600},
        )  # fmt: skip
        if again["status"] != "allocated":
            raise SystemExit(f"placement preemption: a replacement borrower is {again['status']}")
    return ms, len(victims)


async def measure_preemption(
    admin_dsn: str, nodes: int, gpn: int, wanted: int, passes: int, seed: int
) -> PreemptFigures:
    times: dict[bool, list[float]] = {False: [], True: []}
    victims: dict[bool, list[float]] = {False: [], True: []}
    async with common.fresh_database(admin_dsn) as dsn:
        conn = await common.bench_connect(dsn)
        try:
            ids = {}
            for with_nodes in (False, True):
                pool = POOL[with_nodes]
                ids[with_nodes] = await make_pool(
                    conn, pool, nodes=nodes, gpus_per_node=gpn, abstract=not with_nodes
                )
                for k in range(4):
                    await conn.execute(
                        "SELECT respool.create_policy(p_subject => $1, p_pool => $2,"
                        "                             p_priority => $3)",
                        f"low-{k}",
                        pool,
                        k,
                    )
                await conn.execute(
                    "SELECT respool.create_policy(p_subject => 'high', p_pool => $1,"
                    "                             p_priority => 10, p_reserved => $2)",
                    pool,
                    {"gpu": wanted},
                )
                started = time.perf_counter()
                await _fill(conn, pool, nodes * gpn, random.Random(seed))  # noqa: S311
                took = time.perf_counter() - started
                log(f"  placement preemption: {pool} filled in {took:.1f} s")
            await conn.execute("VACUUM ANALYZE")
            seen: set[UUID] = set()
            for with_nodes in (False, True):  # warm the plans up
                await _one_pass(conn, POOL[with_nodes], ids[with_nodes], wanted, seen)
            for _ in range(passes):
                for with_nodes in (False, True):
                    ms, n = await _one_pass(conn, POOL[with_nodes], ids[with_nodes], wanted, seen)
                    times[with_nodes].append(ms)
                    victims[with_nodes].append(n)
            await _healthy(conn, "preemption")
        finally:
            await conn.close()
    figures = PreemptFigures(
        nodes=nodes,
        gpus=nodes * gpn,
        wanted=wanted,
        passes=passes,
        node_ms=Spread.of(times[True]),
        abstract_ms=Spread.of(times[False]),
        node_victims=Spread.of(victims[True]),
        abstract_victims=Spread.of(victims[False]),
    )
    log(
        f"  placement preemption: pass p50 {percentile(times[True], 50):.1f} ms with nodes, "
        f"{percentile(times[False], 50):.1f} ms abstract"
    )
    return figures


# --- 4. slices -------------------------------------------------------------------------------

DEVICE_MB = 81920  # an A100 80 GB (what nvidia-smi reports as memory.total), nothing reserved
SLICE_GIB = (10, 40)  # a slice's memory, whole GiB, uniform
SLICE_JOBS = 0.7  # share of the trace's jobs that are slices; the rest are whole 1/2/4/8 GPUs
SLICE_WITH_SHARE = 1 / 3  # share of slices that also ask a compute share
SLICE_CYCLE_MB, SLICE_CYCLE_SHARE = 20480, 25  # the slice of a cycle
# Pools of the slice cycles: bench-p0 whole devices, no sharing; bench-p1 slices of shared
# devices; bench-p2 whole devices of shared devices (pgbench passes the digit as :kind).
SLICE_KINDS = {0: "whole", 1: "slice", 2: "whole_on_shared"}

SLICE_CYCLE_SQL = """\\set s random(1, :subjects)
SELECT c.request->>'id' AS rid FROM respool.create_request(jsonb_build_object(
    'subject', 'bench-s' || :s::text, 'pool', 'bench-p' || :kind::text,
    'resources', CASE WHEN :kind = 1
                      THEN '{"gpu_memory_mb": MEMORY, "gpu_share": SHARE}'::jsonb
                      ELSE '{"gpu": 1}'::jsonb END,
    'lease_seconds', 300)) c
 WHERE c.request->>'status' = 'allocated'
   AND jsonb_array_length(c.request->'placement'->'devices'->'gpu') = 1
   AND (c.request->'placement'->'slices' ? 'gpu') = (:kind = 1) \\gset
SELECT respool.release_request(p_id => :rid::uuid) IS NOT NULL;
""".replace("MEMORY", str(SLICE_CYCLE_MB)).replace("SHARE", str(SLICE_CYCLE_SHARE))
# (\\gset refuses zero rows: a cycle not granted at once, or granted otherwise than asked (a
# slice on one device in the shared pool, one whole device elsewhere), aborts the run.)

SLICE_NODE_STATE = """
SELECT (SELECT count(*) FROM respool.placements) AS placements,
       (SELECT count(*) FROM respool.node_resources WHERE used <> 0) AS counters,
       (SELECT count(*) FROM respool.node_devices
         WHERE holder_id IS NOT NULL OR memory_used <> 0 OR share_used <> 0) AS devices,
       (SELECT count(*) FROM respool.device_slices) AS slices
"""

SLICE_HOLDERS = """
SELECT coalesce(array_agg(r.id), '{}') AS ids,
       (SELECT coalesce(sum(nr.used), 0) FROM respool.node_resources nr
          JOIN respool.nodes n ON n.id = nr.node_id
         WHERE n.pool_id = $1 AND nr.key = 'gpu_memory_mb') AS node_memory,
       (SELECT count(*) FROM respool.node_devices nd
          JOIN respool.nodes n ON n.id = nd.node_id
         WHERE n.pool_id = $1 AND (nd.holder_id IS NOT NULL OR nd.memory_used > 0)) AS devices
  FROM respool.requests r
 WHERE r.pool_id = $1 AND r.status = 'allocated'
"""


@dataclass(frozen=True)
class Job:
    """One job of the slice trace: whole GPUs (``gpus``) or a slice (``memory_mb``, ``share``)."""

    gpus: int
    memory_mb: int
    share: int | None
    hold: float

    @property
    def is_slice(self) -> bool:
        return self.gpus == 0

    def resources(self) -> dict[str, int]:
        if not self.is_slice:
            return {"gpu": self.gpus}
        out = {"gpu_memory_mb": self.memory_mb}
        if self.share is not None:
            out["gpu_share"] = self.share
        return out

    @property
    def needs_mb(self) -> int:
        """The memory the job needs: its slice, or every device it asks, whole."""
        return self.memory_mb if self.is_slice else self.gpus * DEVICE_MB

    def whole(self) -> Job:
        """The same job asking whole GPUs only: a slice becomes one whole GPU."""
        return Job(1, 0, None, self.hold) if self.is_slice else self


def slice_trace(jobs: int, seed: int) -> list[Job]:
    """``jobs`` slices and whole-GPU jobs, replayable: 70 % slices of 10–40 GiB (whole GiB), a
    third of them with a compute share in proportion to their memory (rounded up to 10 %); 30 %
    whole jobs of 1/2/4/8 GPUs (weights 40/30/20/10 %); hold times uniform in 5–120 minutes."""
    rng = random.Random(seed)  # noqa: S311 - a replayable trace, not crypto
    out = []
    for _ in range(jobs):
        hold = rng.uniform(*HOLD_S)
        if rng.random() < SLICE_JOBS:
            mb = rng.randint(*SLICE_GIB) * 1024
            share = -(-mb * 10 // DEVICE_MB) * 10 if rng.random() < SLICE_WITH_SHARE else None
            out.append(Job(0, mb, share, hold))
        else:
            out.append(Job(rng.choices(SIZES, WEIGHTS)[0], 0, None, hold))
    return out


async def make_shared_pool(
    conn: asyncpg.Connection, name: str, *, nodes: int, gpus_per_node: int, shared: bool
) -> UUID:
    """A ``pack`` pool of ``nodes`` × ``gpus_per_node`` A100 80 GB, sharing ``mps`` (or whole
    devices only, the device memory still given)."""
    doc = await conn.fetchval(
        "SELECT respool.create_pool(p_name => $1, p_capacity => '{}'::jsonb,"
        "                           p_placement => 'pack', p_starvation_seconds => NULL)",
        name,
    )
    devices = [str(d) for d in range(gpus_per_node)]
    body: dict[str, Any] = {"pool": name, "devices": {"gpu": devices},
                            "device_memory_mb": {"gpu": DEVICE_MB}}  # fmt: skip
    if shared:
        body["sharing"] = {"gpu": "mps"}
    for i in range(nodes):
        await conn.execute(
            "SELECT respool.create_node($1::jsonb)", body | {"name": f"{name}-n{i:03d}"}
        )
    rows = await conn.fetch(
        "SELECT key, capacity FROM respool.pool_resources WHERE pool_id = $1::uuid", doc["id"]
    )
    got: dict[str, int] = {r["key"]: r["capacity"] for r in rows}
    want = {"gpu": nodes * gpus_per_node}
    if shared:
        want |= {"gpu_memory_mb": nodes * gpus_per_node * DEVICE_MB,
                 "gpu_share": nodes * gpus_per_node * 100}  # fmt: skip
    if {k: got.get(k) for k in want} != want:
        raise SystemExit(f"placement slices: pool {name} has {got}, expected {want}")
    return UUID(doc["id"])


@dataclass
class SliceReplay(_ReplayRun):
    """One replay of the slice trace (``mode`` ``mixed``: as traced; ``whole``: whole GPUs
    only)."""

    held_memory_share: float  # memory held (slices; whole devices) × time ÷ (offered × window)
    # the same from the end of the longest first hold (the first jobs all gone; None: the
    # window ends before)
    held_memory_share_settled: float | None
    needed_memory_share: float  # memory the jobs need × time ÷ (offered × window)
    busy_gpu_share: float  # devices with a holder or a slice × time ÷ (GPUs × window)
    mean_running: float  # jobs running at once, time-weighted over the window
    granted: int  # jobs granted within the window
    jobs_per_hour: float  # granted ÷ window
    wait_mean_min: float | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _SliceSim(_Clock):
    """The slice trace on one pool, the engine deciding every grant (simulated clock). Each
    job is (what it asks, the memory it needs)."""

    what = "placement slices"

    def __init__(self, conn: asyncpg.Connection, pool: str, pool_id: UUID, gpus: int) -> None:
        super().__init__(conn)
        self.pool, self.pool_id, self.gpus = pool, pool_id, gpus
        self.running: dict[UUID, tuple[Job, int]] = {}
        self.queued: dict[UUID, tuple[Job, int, float]] = {}  # id -> (asks, needs, queued at)
        self.held_mb = self.needed_mb = self.devices = 0
        self.held_mb_s = self.needed_mb_s = self.device_s = self.job_s = 0.0
        self.held_mb_s_settled = 0.0
        self.waits: list[float] = []

    def _start(self, rid: UUID, job: Job, needs: int, waited: float) -> None:
        self.running[rid] = (job, needs)
        self.held_mb += job.needs_mb
        self.needed_mb += needs
        heapq.heappush(self.ends, (self.t + job.hold, rid))
        self.waits.append(waited / 60)

    async def submit(self, job: Job, needs: int) -> None:
        body = {"subject": "slices", "pool": self.pool, "resources": job.resources()}
        rid, queued = await self._submit(body, f"a job {job.resources()}")
        if queued:
            self.queued[rid] = (job, needs, self.t)
        else:
            self._start(rid, job, needs, 0.0)

    async def settle(self) -> None:
        """Learn what the engine granted at this instant; check the holders and the nodes'
        memory counters against the replay's books."""
        row = await self._granted(SLICE_HOLDERS)
        if row["node_memory"] != self.held_mb:
            raise SystemExit(
                f"placement slices: node counters say {row['node_memory']} MiB in use, "
                f"the holders {self.held_mb}"
            )
        self.devices = int(row["devices"])

    def advance(self, to: float) -> None:
        dt = to - self.t
        self.held_mb_s += self.held_mb * dt
        self.held_mb_s_settled += self.held_mb * max(0.0, to - max(self.t, HOLD_S[1]))
        self.needed_mb_s += self.needed_mb * dt
        self.device_s += self.devices * dt
        self.job_s += len(self.running) * dt
        self.t = to
        self.burst = 0

    async def release_next(self) -> None:
        job, needs = self.running.pop(await self._release_first())
        self.held_mb -= job.needs_mb
        self.needed_mb -= needs


async def _replay_slices(
    dsn: str, mode: str, work: list[Job], nodes: int, depth: int
) -> SliceReplay:
    gpn = 8
    conn = await common.bench_connect(dsn)
    try:
        pool = f"slices-{mode}"
        pool_id = await make_shared_pool(conn, pool, nodes=nodes, gpus_per_node=gpn, shared=True)
        await conn.execute(
            "SELECT respool.create_policy(p_subject => 'slices', p_pool => $1)", pool
        )
        sim = _SliceSim(conn, pool, pool_id, nodes * gpn)
        todo = iter([(j if mode == "mixed" else j.whole(), j.needs_mb) for j in work])
        wall = await _replay_trace(sim, todo, depth, "slices", mode, sim.settle)
    finally:
        await conn.close()
    window = sim.t or float("nan")
    offered = sim.gpus * DEVICE_MB * window
    granted = len(sim.waits)
    figures = SliceReplay(
        **sim.run_fields(mode, len(work), wall),
        held_memory_share=sim.held_mb_s / offered,
        held_memory_share_settled=(
            sim.held_mb_s_settled / (sim.gpus * DEVICE_MB * (sim.t - HOLD_S[1]))
            if sim.t > HOLD_S[1]
            else None
        ),
        needed_memory_share=sim.needed_mb_s / offered,
        busy_gpu_share=sim.device_s / (sim.gpus * window),
        mean_running=sim.job_s / window,
        granted=granted,
        jobs_per_hour=granted / (window / 3600),
        wait_mean_min=sum(sim.waits) / granted if granted else None,
    )
    log(
        f"  placement slices: {mode:5} memory held {figures.held_memory_share:.1%}, "
        f"{figures.mean_running:.1f} jobs at once, "
        f"{figures.simulated_hours:.0f} h simulated in {wall:.1f} s"
    )
    return figures


@dataclass
class SliceFigures:
    trace: dict[str, Any]
    mixed: SliceReplay
    whole: SliceReplay
    cycles: dict[str, dict[int, Spread]]  # kind -> clients -> cycles/s
    clients: list[int]

    @property
    def concurrency_ratio(self) -> float:
        return self.mixed.mean_running / self.whole.mean_running

    def cycle_ratio(self, clients: int, kind: str = "whole") -> float:
        return ratio(self.cycles["slice"][clients], self.cycles[kind][clients])

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "mixed": self.mixed.as_dict(),
            "whole": self.whole.as_dict(),
            "concurrency_ratio": self.concurrency_ratio,
            "cycles": {
                k: {str(c): s.as_dict() for c, s in v.items()} for k, v in self.cycles.items()
            },
            "slice_over_whole": {str(c): self.cycle_ratio(c) for c in self.clients},
            "slice_over_whole_on_shared": {
                str(c): self.cycle_ratio(c, "whole_on_shared") for c in self.clients
            },
        }


async def _check_slice_cycles(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow(SLICE_NODE_STATE)
    assert row is not None
    if any(row.values()):
        raise SystemExit(f"placement slice cycles left node state behind: {dict(row)}")
    await check_engine_run(conn)
    await conn.execute(
        "VACUUM ANALYZE respool.node_resources, respool.node_devices, respool.device_slices"
    )


async def measure_slice_cycles(
    dsn: str, clients: list[int], seconds: float, repeats: int, nodes: int, subjects: int
) -> dict[str, dict[int, Spread]]:
    pgbench = common.find_pgbench()
    samples: dict[int, dict[int, list[float]]] = {k: {} for k in SLICE_KINDS}
    conn = await common.bench_connect(dsn)
    try:
        for kind in SLICE_KINDS:
            pool = f"bench-p{kind}"
            await make_shared_pool(conn, pool, nodes=nodes, gpus_per_node=8, shared=kind > 0)
            for s in range(1, subjects + 1):
                await conn.execute(
                    "SELECT respool.create_policy(p_subject => $1, p_pool => $2)",
                    f"bench-s{s}",
                    pool,
                )
        await conn.execute("VACUUM ANALYZE")
        with tempfile.TemporaryDirectory(prefix="respool-bench-") as tmp:
            script = _write_script(Path(tmp, "slice-cycle.sql"), SLICE_CYCLE_SQL)
            defines = {"subjects": str(subjects)}
            for kind in SLICE_KINDS:  # history first (check_engine_run), unmeasured
                await common.run_pgbench(
                    pgbench, dsn, script, clients=max(clients),
                    seconds=min(common.WARM_UP_SECONDS, seconds),
                    defines=defines | {"kind": str(kind)},
                )  # fmt: skip
                await _check_slice_cycles(conn)
            await conn.execute("ANALYZE")  # plans of the measured runs see that history
            for rep in range(repeats):
                for c in clients:
                    for kind, name in SLICE_KINDS.items():
                        tps = await common.run_pgbench(
                            pgbench, dsn, script, clients=c, seconds=seconds,
                            defines=defines | {"kind": str(kind)},
                        )  # fmt: skip
                        samples[kind].setdefault(c, []).append(tps)
                        await _check_slice_cycles(conn)
                        log(f"  placement slice cycles: {rep + 1}/{repeats} {name:15} {c:>2}"
                            f" clients {tps:,.0f}/s")  # fmt: skip
        await _healthy(conn, "slice cycles")
    finally:
        await conn.close()
    return {
        name: {c: Spread.of(v) for c, v in samples[kind].items()}
        for kind, name in SLICE_KINDS.items()
    }


async def measure_slices(
    admin_dsn: str,
    *,
    jobs: int,
    nodes: int,
    depth: int,
    seed: int,
    clients: list[int],
    seconds: float,
    repeats: int,
    subjects: int,
) -> SliceFigures:
    work = slice_trace(jobs, seed)
    replays = {}
    for mode in ("mixed", "whole"):
        async with common.fresh_database(admin_dsn) as dsn:
            replays[mode] = await _replay_slices(dsn, mode, work, nodes, depth)
    async with common.fresh_database(admin_dsn) as dsn:
        cycles = await measure_slice_cycles(dsn, clients, seconds, repeats, nodes, subjects)
    slices = [j for j in work if j.is_slice]
    trace_facts = {
        "jobs": jobs,
        "slices": len(slices),
        "slices_with_share": sum(j.share is not None for j in slices),
        "whole_jobs_by_gpus": {str(g): sum(j.gpus == g for j in work) for g in SIZES},
        "nodes": nodes,
        "device_memory_mb": DEVICE_MB,
        "sharing": "mps",
        "queue_depth": depth,
        "seed": seed,
    }
    return SliceFigures(trace_facts, replays["mixed"], replays["whole"], cycles, clients)


# --- the command -----------------------------------------------------------------------------


@dataclass
class PlacementResults(Figures):
    cycles: CycleFigures | None = None
    fragmentation: dict[str, FragFigures] | None = None
    preemption: PreemptFigures | None = None
    slices: SliceFigures | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cycles:
            out["cycles"] = self.cycles.as_dict()
        if self.fragmentation:
            out["fragmentation"] = {m: f.as_dict() for m, f in self.fragmentation.items()}
        if self.preemption:
            out["preemption"] = self.preemption.as_dict()
        if self.slices:
            out["slices"] = self.slices.as_dict()
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server (default: %(default)s)")
    parser.add_argument(
        "--scenario", choices=SCENARIOS, default=None, help="one scenario (default: all four)"
    )
    parser.add_argument(
        "--seconds", type=float, default=None,
        help="cycles: seconds per run (cycles 10, slice cycles 2)",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=int, default=None, help="cycles: runs per figure (cycles 3, slices 2)"
    )
    parser.add_argument(
        "--clients", type=positive_ints, default=[1, 8], help="cycles: clients (1,8)"
    )
    parser.add_argument("--subjects", type=int, default=1, help="cycles, slices: subjects (1)")
    parser.add_argument(
        "--nodes", type=int, default=100, help="cycles, preemption: nodes of 8 GPUs (100)"
    )
    parser.add_argument(
        "--frag-nodes", type=int, default=16, help="fragmentation: nodes of 8 GPUs (16)"
    )
    parser.add_argument("--jobs", type=int, default=2000, help="fragmentation: jobs (2000)")
    parser.add_argument(
        "--queue-depth", type=int, default=32,
        help="fragmentation, slices: jobs kept waiting (32)",
    )  # fmt: skip
    parser.add_argument(
        "--slice-nodes", type=int, default=16,
        help="slices: nodes of 8 shared A100 80 GB, trace and cycles (16)",
    )  # fmt: skip
    parser.add_argument("--slice-jobs", type=int, default=1000, help="slices: jobs (1000)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"traces' seed ({SEED})")
    parser.add_argument(
        "--starvation-seconds",
        type=int,
        default=None,
        help="fragmentation: the pools' starvation guard (default: off, so that a wait with "
        "enough free GPUs is placement's doing)",
    )
    parser.add_argument("--passes", type=int, default=20, help="preemption: timed passes (20)")
    parser.add_argument(
        "--preempt-gpus", type=int, default=4, help="preemption: GPUs the in-share request asks (4)"
    )


def _check(args: argparse.Namespace) -> None:
    for name in ("seconds", "repeats", "subjects", "nodes", "frag_nodes", "jobs", "queue_depth",
                 "passes", "slice_nodes", "slice_jobs"):  # fmt: skip
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if not 1 <= args.preempt_gpus <= 8:
        raise SystemExit("--preempt-gpus must be 1..8 (one node's GPUs)")
    if args.starvation_seconds is not None and args.starvation_seconds < 0:
        raise SystemExit("--starvation-seconds must be >= 0")


async def _measure(args: argparse.Namespace) -> PlacementResults:
    await common.durable_server(args.dsn)
    only = [args.scenario] if args.scenario else list(SCENARIOS)
    out = PlacementResults()
    if "cycles" in only:
        async with common.fresh_database(args.dsn) as dsn:
            out.cycles = await measure_cycles(
                dsn, args.clients, args.seconds or 10, args.repeats or 3, args.nodes, 8,
                args.subjects,
            )  # fmt: skip
    if "fragmentation" in only:
        out.fragmentation = await measure_fragmentation(
            args.dsn, args.jobs, args.frag_nodes, args.queue_depth, args.seed,
            args.starvation_seconds,
        )  # fmt: skip
    if "preemption" in only:
        out.preemption = await measure_preemption(
            args.dsn, args.nodes, 8, args.preempt_gpus, args.passes, args.seed
        )
    if "slices" in only:
        out.slices = await measure_slices(
            args.dsn, jobs=args.slice_jobs, nodes=args.slice_nodes, depth=args.queue_depth,
            seed=args.seed, clients=args.clients, seconds=args.seconds or 2,
            repeats=args.repeats or 2, subjects=args.subjects,
        )  # fmt: skip
    return out


def _s(n: float) -> str:
    return "" if n == 1 else "s"


def _minutes(m: float | None) -> str:
    return "–" if m is None else f"{m:,.0f}"


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{share:.1%}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def rows(r: PlacementResults) -> list[list[str]]:
    """One row per figure: what, measured, target, verdict."""
    out: list[list[str]] = []
    if c := r.cycles:
        for n in c.clients:
            k = c.ratio(n)
            out.append([
                f"cycles/s, {n} client{_s(n)}: nodes ÷ abstract",
                f"{c.nodes[n].fmt()} / {c.abstract[n].fmt()} = {k:.2f} ×",
                f"≥ {TARGETS['cycles']}",
                _verdict(k >= TARGETS["cycles"]),
            ])  # fmt: skip
    if f := r.fragmentation:
        for mode, x in f.items():
            label = "abstract units (reference)" if mode == "abstract" else mode
            target = mode == "pack"
            out.append([
                f"busy GPU-time, {label}",
                f"{x.busy_share:.1%} ({x.gpus} GPUs, {x.jobs:,} jobs, {x.simulated_hours:,.0f} h)",
                f"≥ {TARGETS['busy']:.0%}" if target else "–",
                _verdict(x.busy_share >= TARGETS["busy"]) if target else "",
            ])  # fmt: skip
            waits = ", ".join(
                f"{s}: {_minutes(x.wait_mean_min[s])}/{_minutes(x.wait_p90_min[s])}" for s in SIZES
            )
            by_size = ", ".join(
                f"{g}: {x.events_by_gpus[g]:,}/{x.jobs_hit_by_gpus[g]:,}" for g in SIZES
            )
            out.append([
                f"fragmentation, {label}",
                f"{x.fragmentation_events:,} events ({x.jobs_hit:,} jobs; by GPUs {by_size}), "
                f"{x.stranded_share:.1%} of GPU-time free while one fit; "
                f"wait mean/p90 min by GPUs {waits}",
                "–", "",
            ])  # fmt: skip
    if p := r.preemption:
        for name, label in (("node", f"{p.nodes} nodes"), ("abstract", "abstract units")):
            ms: Spread = getattr(p, f"{name}_ms")
            p50, p90 = percentile(ms.values, 50), percentile(ms.values, 90)
            victims: Spread = getattr(p, f"{name}_victims")
            out.append([
                f"preempting pass, {label} ({p.gpus} GPUs, {p.wanted} wanted), p50 / p90",
                f"{p50:.1f} / {p90:.1f} ms ({victims.median:g} victim{_s(victims.median)})",
                f"≤ {TARGETS['preemption_ms']:.0f} ms" if name == "node" else "–",
                _verdict(p90 <= TARGETS["preemption_ms"]) if name == "node" else "",
            ])  # fmt: skip
    if sl := r.slices:
        for replay, label in ((sl.mixed, "slices and whole GPUs"), (sl.whole, "whole GPUs only")):
            mixed = replay is sl.mixed
            out.append([
                f"busy GPU memory-time, {label}",
                f"{replay.held_memory_share:.1%} held ({_pct(replay.held_memory_share_settled)} "
                f"after {HOLD_S[1] // 3600} h), {replay.needed_memory_share:.1%} needed "
                f"({replay.gpus} GPUs, {replay.jobs:,} jobs, {replay.simulated_hours:,.0f} h; "
                f"GPUs busy {replay.busy_gpu_share:.1%})",
                f"≥ {TARGETS['slice_memory']:.0%}" if mixed else "–",
                _verdict(replay.held_memory_share >= TARGETS["slice_memory"]) if mixed else "",
            ])  # fmt: skip
        out.append([
            "jobs running at once: slices ÷ whole GPUs only",
            f"{sl.mixed.mean_running:.1f} / {sl.whole.mean_running:.1f} = "
            f"{sl.concurrency_ratio:.2f} × ({sl.mixed.jobs_per_hour:,.0f} / "
            f"{sl.whole.jobs_per_hour:,.0f} jobs/h)",
            "–", "",
        ])  # fmt: skip
        for n in sl.clients:
            k = sl.cycle_ratio(n)
            out.append([
                f"cycles/s, {n} client{_s(n)}: slice ÷ whole device",
                f"{sl.cycles['slice'][n].fmt()} / {sl.cycles['whole'][n].fmt()} = {k:.2f} × "
                f"(whole on the shared pool {sl.cycles['whole_on_shared'][n].fmt()})",
                f"≥ {TARGETS['slice_cycles']}",
                _verdict(k >= TARGETS["slice_cycles"]),
            ])  # fmt: skip
    return out


def run(args: argparse.Namespace) -> int:
    _check(args)
    r = asyncio.run(_measure(args))
    return report(r, ["figure", "measured", "target", ""], rows(r))
