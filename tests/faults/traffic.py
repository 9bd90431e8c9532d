"""Client traffic for the fault tests: workers that create, wait, hold and release requests
through the HTTP API the way a careful client does, and record what the API acknowledged.

Each worker loops over *cycles*: create a request (its own idempotency key, retried with the same
key on any connection error or 503), long-poll until it is no longer queued, hold it (heartbeats
with ``?attempt=``), release it. Some cycles may *abandon* their grant (no heartbeat, no release)
so that its lease expires. Every HTTP answer is classified:

* 2xx/4xx: fine (409 on a stale attempt is the fencing working);
* 503 must carry ``Retry-After``; the call is retried after a short pause;
* any other 5xx, a 503 without ``Retry-After``, a timeout (``hang``) are anomalies.

``acked_grants`` holds every (request id, attempt) the API answered as ``allocated``,
``acked_releases`` every request it answered as ``released``: after a crash they must all still
be in the database (:func:`lost_acknowledgements`).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx

from support.faults import Auditor
from support.http import contended_pool
from support.server import Server
from support.wait import wait_until

__all__ = [
    "Profile",
    "Traffic",
    "assert_nothing_lost",
    "audit_figures",
    "duplicated_keys",
    "listener_back",
    "lost_acknowledgements",
]

TERMINAL = frozenset({"released", "rejected", "cancelled", "expired", "preempted"})


@dataclass(frozen=True)
class Profile:
    """What the workers do. ``subjects`` are (subject, preemptible share, max_retries)."""

    subjects: tuple[tuple[str, float, int], ...] = (("team", 1.0, 0),)
    pool: str | None = None
    gpus: tuple[int, ...] = (1,)
    hold: tuple[float, float] = (0.0, 0.1)  # seconds a grant is held (uniform)
    lease_seconds: int = 30
    abandon: float = 0.0  # share of grants abandoned (left to expire)
    wait: float = 2.0  # long-poll seconds per call
    cycle_budget: float = 60.0  # a cycle gives up (cancels) after this long
    http_timeout: float = 60.0  # an answer slower than this is a hang (bound: 10 + 30 + 10 s)


# Traffic on :func:`support.http.contended_pool`: ``a`` half preemptible, ``b`` borrowing.
CONTENDED = Profile(
    subjects=(("a", 0.5, 1), ("b", 1.0, 1)), pool="p", gpus=(1, 2), hold=(0.0, 0.3), wait=2.0
)


async def contended_traffic(server: Server, *, workers: int, seed: int = 1) -> Traffic:
    """:func:`support.http.contended_pool` on ``server``, and :data:`CONTENDED` traffic for it
    (not started)."""
    await contended_pool(server.client)
    return Traffic(server.url, CONTENDED, workers=workers, seed=seed)


@dataclass
class Traffic:
    base_url: str
    profile: Profile = field(default_factory=Profile)
    workers: int = 8
    seed: int = 1
    codes: Counter[str] = field(default_factory=Counter)
    tally: Counter[str] = field(default_factory=Counter)
    anomalies: list[str] = field(default_factory=list)
    acked_grants: set[tuple[str, int]] = field(default_factory=set)
    acked_releases: set[str] = field(default_factory=set)
    id_changes: list[str] = field(default_factory=list)
    max_latency: float = 0.0
    last_ok: float = 0.0  # monotonic time of the last 2xx
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _client: httpx.AsyncClient | None = None

    # --- HTTP with the classification above ---

    async def call(self, method: str, path: str, **kw: Any) -> httpx.Response | None:
        """One call; None when it must be retried (connection error or 503)."""
        assert self._client is not None
        start = time.monotonic()
        try:
            r = await self._client.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            self.codes["timeout"] += 1
            self.anomalies.append(f"hang: {method} {path}: {type(exc).__name__}")
            return None
        except httpx.TransportError as exc:
            self.codes[type(exc).__name__] += 1
            return None
        finally:
            self.max_latency = max(self.max_latency, time.monotonic() - start)
        self.codes[str(r.status_code)] += 1
        if r.status_code == 503:
            if not r.headers.get("retry-after"):
                self.anomalies.append(f"503 without Retry-After: {method} {path}")
            return None
        if r.status_code >= 500:
            self.anomalies.append(f"{r.status_code}: {method} {path}: {r.text[:300]}")
            return None
        if r.status_code < 300:
            self.last_ok = time.monotonic()
        return r

    async def retrying(
        self, deadline: float, method: str, path: str, **kw: Any
    ) -> httpx.Response | None:
        """``call`` until answered or ``deadline``; retries after 0.05-0.3 s."""
        rng = random.Random()
        while time.monotonic() < deadline:
            r = await self.call(method, path, **kw)
            if r is not None:
                return r
            self.tally["retries"] += 1
            await asyncio.sleep(rng.uniform(0.05, 0.3))
        return None

    # --- one cycle ---

    def _note(self, doc: dict[str, Any]) -> None:
        if doc["status"] == "allocated":
            self.acked_grants.add((doc["id"], int(doc["attempt"])))
        elif doc["status"] == "released":
            self.acked_releases.add(doc["id"])

    async def cycle(self, rng: random.Random) -> None:
        p = self.profile
        deadline = time.monotonic() + p.cycle_budget
        subject, preemptible_share, max_retries = rng.choice(p.subjects)
        body: dict[str, Any] = {
            "subject": subject,
            "resources": {"gpu": rng.choice(p.gpus)},
            "preemptible": rng.random() < preemptible_share,
            "max_retries": max_retries,
            "lease_seconds": p.lease_seconds,
            "idempotency_key": str(uuid.uuid4()),
        }
        if p.pool:
            body["pool"] = p.pool
        params = {"wait": p.wait}
        r = await self.retrying(deadline, "POST", "/v1/requests", params=params, json=body)
        if r is None:
            self.tally["create_gave_up"] += 1
            return
        if r.status_code not in (200, 201):
            self.anomalies.append(f"create answered {r.status_code}: {r.text[:300]}")
            return
        doc = r.json()
        rid = doc["id"]
        self.tally["created"] += 1
        self._note(doc)
        while True:
            status = doc["status"]
            if status in TERMINAL:
                self.tally[f"ended_{status}"] += 1
                return
            if status in ("allocated", "preempting"):
                await self._hold(rng, doc, deadline)
                return
            if time.monotonic() >= deadline or self.stop.is_set():
                await self.retrying(deadline + 30, "POST", f"/v1/requests/{rid}/cancel")
                self.tally["cancelled_waiting"] += 1
                return
            r = await self.retrying(
                deadline,
                "GET",
                f"/v1/requests/{rid}",
                params={"wait": p.wait, "version": doc["version"]},
            )
            if r is None:
                continue
            if r.status_code != 200:
                self.anomalies.append(f"poll answered {r.status_code}: {r.text[:300]}")
                return
            self.tally["polls"] += 1
            doc = r.json()
            if doc["id"] != rid:
                self.id_changes.append(f"{rid} became {doc['id']}")
            self._note(doc)

    async def _hold(self, rng: random.Random, doc: dict[str, Any], deadline: float) -> None:
        p = self.profile
        rid, attempt = doc["id"], int(doc["attempt"])
        if doc["status"] == "allocated" and rng.random() < p.abandon:
            self.tally["abandoned"] += 1  # no heartbeat, no release: the lease expires
            return
        # A step told to stop (preempting) releases at once.
        until = time.monotonic() + (rng.uniform(*p.hold) if doc["status"] == "allocated" else 0)
        while time.monotonic() < until and not self.stop.is_set():
            await asyncio.sleep(min(p.lease_seconds / 4, max(0.0, until - time.monotonic())))
            if time.monotonic() >= until:
                break
            r = await self.retrying(
                deadline, "POST", f"/v1/requests/{rid}/heartbeat", params={"attempt": attempt}
            )
            if r is None or r.status_code == 409 or r.json()["status"] != "allocated":
                self.tally["lost_while_holding"] += 1
                break
            self.tally["heartbeats"] += 1
        r = await self.retrying(
            deadline + 30, "POST", f"/v1/requests/{rid}/release", params={"attempt": attempt}
        )
        if r is None:
            self.tally["release_gave_up"] += 1
            return
        if r.status_code == 409:  # requeued under a new attempt meanwhile: drop it
            self.tally["release_fenced"] += 1
            r = await self.retrying(deadline + 30, "POST", f"/v1/requests/{rid}/release")
            if r is None:
                return
        if r.status_code != 200:
            self.anomalies.append(f"release answered {r.status_code}: {r.text[:300]}")
            return
        self._note(r.json())
        self.tally[f"released_as_{r.json()['status']}"] += 1

    # --- running ---

    async def _worker(self, w: int) -> None:
        rng = random.Random(self.seed * 1000 + w)
        while not self.stop.is_set():
            await self.cycle(rng)
            self.tally["cycles"] += 1

    async def run_until_stopped(self) -> None:
        """Run the workers until :attr:`stop` is set; each finishes its current cycle."""
        limits = httpx.Limits(max_connections=self.workers * 2 + 10)
        async with httpx.AsyncClient(
            base_url=self.base_url, timeout=self.profile.http_timeout, limits=limits
        ) as client:
            self._client = client
            try:
                await asyncio.gather(*(self._worker(w) for w in range(self.workers)))
            finally:
                self._client = None

    def summary(self) -> dict[str, Any]:
        return {
            "cycles": self.tally["cycles"],
            "acked_grants": len(self.acked_grants),
            "acked_releases": len(self.acked_releases),
            "http": dict(sorted(self.codes.items())),
            "retries": self.tally["retries"],
            "max_latency_s": round(self.max_latency, 2),
            "anomalies": len(self.anomalies),
        }


async def lost_acknowledgements(
    conn: asyncpg.Connection, grants: set[tuple[str, int]], releases: set[str]
) -> tuple[list[str], list[str]]:
    """Acknowledged grants with no ``allocated`` event for that attempt, and acknowledged
    releases whose request is not ``released`` in the database."""
    rows = await conn.fetch(
        "SELECT DISTINCT request_id::text AS id, attempt FROM respool.request_events"
        " WHERE to_status = 'allocated'"
    )
    have = {(r["id"], r["attempt"]) for r in rows}
    lost_grants = sorted(f"{i}#{a}" for i, a in grants - have)
    released = {
        r["id"]
        for r in await conn.fetch(
            "SELECT id::text AS id FROM respool.requests WHERE status = 'released'"
        )
    }
    lost_releases = sorted(releases - released)
    return lost_grants, lost_releases


async def duplicated_keys(conn: asyncpg.Connection) -> int:
    """How many (subject, idempotency key) made more than one request (each one a duplicate)."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT count(*) FROM (SELECT 1 FROM respool.requests"
        " WHERE idempotency_key IS NOT NULL"
        " GROUP BY subject, idempotency_key HAVING count(*) > 1) d"
    )


async def listener_back(server: Server) -> float:
    """Seconds until the server's NOTIFY listener is healthy again (at most 60)."""

    async def listening() -> bool:
        return server.notifier.healthy

    return await wait_until(listening, "the listener", within=60)


def audit_figures(
    auditor: Auditor, lost_grants: list[str], lost_releases: list[str]
) -> dict[str, int]:
    """The figures every fault run reports about lost acknowledgements and the auditor."""
    return {
        "acked_lost": len(lost_grants) + len(lost_releases),
        "auditor_snapshots": auditor.snapshots,
        "violations": len(auditor.violations),
    }


def assert_nothing_lost(
    auditor: Auditor, traffic: Traffic, lost_grants: list[str], lost_releases: list[str]
) -> None:
    """No invariant broken, no anomaly in the traffic, no acknowledged grant or release lost."""
    assert auditor.violations == [], auditor.violations[:10]
    assert traffic.anomalies == [], traffic.anomalies[:10]
    assert lost_grants == [] and lost_releases == []
