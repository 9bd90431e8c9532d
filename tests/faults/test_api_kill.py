"""Row 3: API processes SIGKILLed mid-POST while clients retry with the same idempotency key.

Two ``respool serve`` processes share one database (like two replicas behind a load balancer).
Client workers create requests, each logical create with its own idempotency key, and retry it on
any connection error or 503, on either process, until it is answered. A killer SIGKILLs one
process every 0.3-1.0 s and starts it again. Some POSTs die in flight after their transaction
committed: their retry must replay the same request (200), never create a second one.

Figures: logical creates, POSTs killed in flight, POSTs refused (process down), replays after a
kill, duplicates (rows per key > 1, or a retry answered with another id) = 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from support.db import direct
from support.faults import long_mode, pick, record
from support.server import ServeProcess

pytestmark = pytest.mark.faults

WORKERS = 24


async def test_sigkill_mid_post_never_duplicates(db_url: str, tmp_path: Path) -> None:
    seconds = pick(20.0, 150.0)
    servers = [ServeProcess(db_url, tmp_path, reconciler=False, name=f"api{i}") for i in (0, 1)]
    for s in servers:
        s.start()
    stop = asyncio.Event()
    tally: Counter[str] = Counter()
    answered: dict[str, str] = {}  # key -> request id
    mismatches: list[str] = []
    try:
        for s in servers:
            await s.ready()
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
        async with httpx.AsyncClient(timeout=15, limits=limits) as c:
            r = await c.post(
                f"{servers[0].url}/v1/pools", json={"name": "big", "capacity": {"gpu": 1000000}}
            )
            assert r.status_code == 201, r.text
            r = await c.post(f"{servers[0].url}/v1/policies", json={"subject": "t", "pool": "big"})
            assert r.status_code == 201, r.text

            async def create(key: str, rng: random.Random) -> None:
                body = {
                    "subject": "t",
                    "resources": {"gpu": 1},
                    "idempotency_key": key,
                    "labels": {"op": key},
                }
                tries = 0
                first_id: str | None = None
                deadline = time.monotonic() + 120  # bounded even if both processes stay down
                while time.monotonic() < deadline:
                    tries += 1
                    server = rng.choice(servers)
                    try:
                        r = await c.post(f"{server.url}/v1/requests", json=body)
                    except httpx.ConnectError:
                        tally["refused"] += 1  # the process is down: not even sent
                    except httpx.TransportError:
                        tally["killed_in_flight"] += 1  # sent; the process died before answering
                    else:
                        if r.status_code == 503:
                            tally["answered_503"] += 1
                        elif r.status_code in (200, 201):
                            rid = r.json()["id"]
                            if first_id is not None and rid != first_id:
                                mismatches.append(f"{key}: {first_id} then {rid}")
                            first_id = rid
                            answered[key] = rid
                            tally[f"answered_{r.status_code}"] += 1
                            if r.status_code == 200 and tries > 1:
                                tally["replayed_after_failure"] += 1
                            return
                        else:
                            tally[f"unexpected_{r.status_code}"] += 1
                            mismatches.append(f"{key}: HTTP {r.status_code} {r.text[:200]}")
                            return
                    tally["retried"] += 1
                    await asyncio.sleep(rng.uniform(0.01, 0.05))
                mismatches.append(f"{key}: never answered")

            async def worker(w: int) -> None:
                rng = random.Random(w)
                n = 0
                while not stop.is_set():
                    n += 1
                    tally["logical"] += 1
                    await create(f"w{w}-{n}", rng)

            async def killer() -> None:
                rng = random.Random(7)
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), rng.uniform(0.3, 1.0))
                    if stop.is_set():
                        return
                    victim = rng.choice(servers)
                    victim.kill()
                    tally["kills"] += 1
                    victim.start()
                    await victim.ready()

            tasks = [asyncio.create_task(worker(w)) for w in range(WORKERS)]
            kill_task = asyncio.create_task(killer())
            await asyncio.sleep(seconds)
            stop.set()
            await asyncio.wait_for(kill_task, 60)
            await asyncio.wait_for(asyncio.gather(*tasks), 150)
    finally:
        for s in servers:
            s.close()

    async with direct(db_url) as conn:
        rows = await conn.fetch(
            "SELECT labels->>'op' AS op, count(*) AS n, min(id::text) AS id"
            " FROM respool.requests WHERE subject = 't' GROUP BY 1"
        )
    per_key = {r["op"]: (r["n"], r["id"]) for r in rows}
    duplicates = sum(1 for n, _ in per_key.values() if n > 1) + len(mismatches)
    orphans = sorted(set(per_key) - set(answered))  # a row no client got an answer for
    wrong_id = [k for k, rid in answered.items() if per_key.get(k, (0, ""))[1] != rid]
    figures = {
        "seconds": seconds,
        "kills": tally["kills"],
        "logical_creates": tally["logical"],
        "posts_killed_in_flight": tally["killed_in_flight"],
        "posts_refused_while_down": tally["refused"],
        "posts_answered_503": tally["answered_503"],
        "posts_retried": tally["retried"],
        "killed_or_retried": tally["retried"],  # every failed POST was retried
        "replayed_after_a_failure": tally["replayed_after_failure"],
        "rows": len(per_key),
        "duplicates": duplicates,
        "orphans": len(orphans),
    }
    record("row3 SIGKILL mid-POST, idempotent retries", **figures)
    assert mismatches == [], mismatches[:10]
    assert duplicates == 0 and orphans == [] and wrong_id == []
    assert len(per_key) == tally["logical"] == len(answered)
    assert tally["kills"] >= 1  # how many fit in the run depends on the machine's speed
    assert tally["killed_in_flight"] > 0  # the kills did hit POSTs in flight
    if long_mode():
        assert figures["killed_or_retried"] >= 1000
