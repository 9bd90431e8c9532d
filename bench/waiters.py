"""Scenario 5: waiters at scale. N requests wait in one pool whose units one holder request
holds; each of them is long-polled (``GET /v1/requests/{id}?wait=…&version=1``) on its own
HTTP connection to one ``respool serve`` process (default pool of 10 database connections, the
reconciler on). With every waiter registered, we read the database connections the server
holds (``pg_stat_activity``) and its RSS; then the holder is released in one transaction, which
grants ``--capacity`` of the waiters. Measured: from the release's COMMIT to the last granted
waiter's answer, and correctness: exactly the granted requests answer, each once and
``allocated``, and the rest are still queued (their long-polls still open).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import msgspec

from bench.common import bench_connect, broken_invariants, checked, log
from bench.rawhttp import Connection, Reply, split_url
from bench.wake import percentile, serve_process

API_APPS = ("respool-api", "respool-listener", "respool-reconciler")
POOL_SIZE = 10  # RESPOOL_DB_POOL_SIZE's default, what `respool serve` runs with
CHUNK = 250  # long-polls opened at a time


@dataclass(frozen=True)
class WaitersResult:
    waiters: int
    granted: int
    connections: int
    connections_by_app: dict[str, int]
    pool_size: int
    rss_mb: float
    register_s: float
    wake_all_ms: float
    wake_p50_ms: float
    release_txn_ms: float
    correct: bool
    problems: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


_decode = msgspec.json.Decoder().decode


def _rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for process {pid}")


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        raise SystemExit(f"need {needed} open files, the limit is {soft} (ulimit -n)")


async def _waiting(http: httpx.AsyncClient) -> float:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith("respool_waiters "):
            return float(line.split()[1])
    raise SystemExit("GET /metrics has no respool_waiters gauge")


async def _create_waiters(conn: asyncpg.Connection, n: int, batch: int = 250) -> list[uuid.UUID]:
    ids: list[uuid.UUID] = []
    while len(ids) < n:
        k = min(batch, n - len(ids))
        rows = await conn.fetch(
            "SELECT ((respool.create_request("
            '        \'{"subject": "w", "pool": "wide", "resources": {"gpu": 1}}\')'
            "       ).request ->> 'id')::uuid"
            "  FROM generate_series(1, $1)",
            k,
        )
        ids += [r[0] for r in rows]
    return ids


async def measure(dsn: str, waiters: int, capacity: int, max_wait: int = 600) -> WaitersResult:
    if not 0 < capacity < waiters:
        raise SystemExit("--capacity must be between 1 and --waiters - 1")
    _raise_fd_limit(waiters + 1000)
    conn = await bench_connect(dsn)
    problems: list[str] = []
    try:
        await conn.execute(
            "SELECT respool.create_pool(p_name => 'wide', p_capacity => $1)", {"gpu": capacity}
        )
        await conn.execute("SELECT respool.create_policy(p_subject => 'w', p_pool => 'wide')")
        holder = await conn.fetchval(
            "SELECT ((respool.create_request(jsonb_build_object('subject', 'w', 'pool', 'wide',"
            "         'resources', $1::jsonb))).request ->> 'id')::uuid",
            {"gpu": capacity},
        )
        started = time.perf_counter()
        ids = await _create_waiters(conn, waiters)
        log(
            f"  waiters: {waiters} queued requests created in {time.perf_counter() - started:.1f} s"
        )
        await conn.execute("VACUUM ANALYZE respool.requests, respool.queue_entries")
        db_name = await conn.fetchval("SELECT current_database()")
        env = {"RESPOOL_MAX_WAIT": str(max_wait), "RESPOOL_DB_POOL_SIZE": str(POOL_SIZE)}
        with serve_process(dsn, reconciler=True, env=env) as (url, proc):
            host, port = split_url(url)
            conns: list[Connection] = []
            started = time.perf_counter()
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                # In chunks, each registered before the next is sent: 10,000 first reads at
                # once would queue for the 10 pooled connections longer than the API's acquire
                # timeout (they would get 503s).
                deadline = time.monotonic() + max_wait / 2
                for i in range(0, waiters, CHUNK):
                    chunk = [Connection(host, port) for _ in ids[i : i + CHUNK]]
                    await asyncio.gather(*(c.open() for c in chunk))
                    for c, rid in zip(chunk, ids[i : i + CHUNK], strict=True):
                        c.send("GET", f"/v1/requests/{rid}?wait={max_wait}&version=1")
                    conns += chunk
                    while await _waiting(http) < len(conns):
                        if time.monotonic() > deadline:
                            raise SystemExit("the long-polls did not all register in time")
                        await asyncio.sleep(0.05)
                register_s = time.perf_counter() - started
                rows = await conn.fetch(
                    "SELECT application_name, count(*) FROM pg_stat_activity"
                    " WHERE datname = $1 AND application_name = ANY($2::text[]) GROUP BY 1",
                    db_name,
                    list(API_APPS),
                )
                by_app = {r[0]: int(r[1]) for r in rows}
                rss_mb = _rss_mb(proc.pid)
                log(
                    f"  waiters: {waiters} registered in {register_s:.1f} s; connections {by_app}; "
                    f"RSS {rss_mb:.0f} MB"
                )

                replies: list[tuple[int, Reply]] = []

                async def read(i: int, c: Connection) -> None:
                    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                        replies.append((i, await c.read_reply()))

                readers = [asyncio.create_task(read(i, c)) for i, c in enumerate(conns)]
                before = time.perf_counter()
                async with conn.transaction():
                    await conn.execute("SELECT respool.release_request(p_id => $1)", holder)
                committed = time.perf_counter()
                deadline = time.monotonic() + 60
                while len(replies) < capacity and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
                await asyncio.sleep(1.0)  # anything more that answers is a wrong wake
                got = list(replies)
                for t in readers:
                    t.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
                await asyncio.gather(*(c.close() for c in conns))
        arrivals = [r.first_byte - committed for _, r in got]
        answered: set[uuid.UUID] = set()
        for i, r in got:
            doc = _decode(r.body)
            if r.status != 200 or doc["status"] != "allocated":
                problems.append(f"waiter {ids[i]} answered {r.status} {doc.get('status')}")
            if doc.get("id") != str(ids[i]):
                problems.append(f"connection for {ids[i]} got request {doc.get('id')}")
            answered.add(ids[i])
        if len(got) != capacity:
            problems.append(f"{len(got)} answers for {capacity} granted units")
        counts = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'allocated') AS allocated,"
            "       count(*) FILTER (WHERE status = 'queued') AS queued"
            "  FROM respool.requests WHERE id = ANY($1::uuid[])",
            ids,
        )
        assert counts is not None
        if counts["allocated"] != capacity or counts["queued"] != waiters - capacity:
            problems.append(f"in the database: {dict(counts)}")
        allocated_ids = {
            r[0]
            for r in await conn.fetch(
                "SELECT id FROM respool.requests"
                " WHERE id = ANY($1::uuid[]) AND status = 'allocated'",
                ids,
            )
        }
        if allocated_ids != answered:
            problems.append(
                f"{len(allocated_ids - answered)} granted without an answer, "
                f"{len(answered - allocated_ids)} answered without a grant"
            )
        if await broken_invariants(conn):
            problems.append("invariant violations")
    finally:
        await conn.close()
    return WaitersResult(
        waiters=waiters,
        granted=capacity,
        connections=sum(by_app.values()),
        connections_by_app=by_app,
        pool_size=POOL_SIZE,
        rss_mb=rss_mb,
        register_s=register_s,
        wake_all_ms=max(arrivals) * 1000 if arrivals else float("nan"),
        wake_p50_ms=percentile(arrivals, 50) * 1000 if arrivals else float("nan"),
        release_txn_ms=(committed - before) * 1000,
        **checked(problems),
    )
