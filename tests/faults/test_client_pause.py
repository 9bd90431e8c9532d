"""Row 4: a client paused past its lease (SIGSTOP ... SIGCONT).

The step (tests/faults/pause_client.py, a process using respool_client) holds one GPU of a pool of
one, and is frozen with SIGSTOP for twice its lease:

* **expiry**: the reconciler expires its lease and grants the GPU to the next request. The stale
  step's heartbeat and release change nothing (the request stays ``expired``, never revived).
* **requeue** (``max_retries=1``): the owner of the reservation reclaims the GPU, the step's
  request is requeued as attempt 2 and granted again while the step is still frozen. Every call
  of the stale attempt 1 (heartbeat, release, cancel with ``?attempt=1``) is 409 and changes
  nothing (fencing, docs/api.md).

In both, the step must not use the GPU after its allocation ended on the server, nor after the
GPU was granted to someone else: ``double use`` = uses after the next holder's grant = 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.db import direct
from support.faults import pick, record
from support.http import get_request, ok
from support.server import running_server
from support.wait import wait_until

pytestmark = pytest.mark.faults

LEASE = 2  # seconds; the step heartbeats every LEASE / 4
PAUSE = 2 * LEASE  # SIGSTOP for this long


@dataclass
class Step:
    proc: asyncio.subprocess.Process
    events: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


@contextlib.asynccontextmanager
async def step_process(url: str, subject: str, pool: str, max_retries: int) -> AsyncIterator[Step]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("pause_client.py")),
        url,
        subject,
        pool,
        str(max_retries),
        str(LEASE),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    step = Step(proc)

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            with contextlib.suppress(ValueError):
                step.events.append(json.loads(line))

    step.reader = asyncio.create_task(read())
    try:
        yield step
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        await proc.wait()
        await step.reader


async def _allocation_end(db_url: str, request_id: str, attempt: int) -> float:
    """Server time (epoch seconds) at which ``attempt`` of the request stopped holding."""
    async with direct(db_url) as conn:
        at = await conn.fetchval(
            "SELECT extract(epoch FROM min(at))::float8 FROM respool.request_events"
            " WHERE request_id = $1 AND attempt = $2 AND from_status = 'allocated'",
            request_id,
            attempt,
        )
    assert at is not None, "the allocation never ended"
    return float(at)


async def _allocated_at(db_url: str, request_id: str) -> float:
    async with direct(db_url) as conn:
        at = await conn.fetchval(
            "SELECT extract(epoch FROM allocated_at)::float8 FROM respool.requests WHERE id = $1",
            request_id,
        )
    assert at is not None
    return float(at)


async def _granted_then_frozen(step: Step) -> tuple[str, float]:
    """Wait for the step's grant, let it heartbeat for a while, then SIGSTOP it; returns its
    request id and when it was stopped."""

    async def granted() -> bool:
        return bool(step.of("granted"))

    await wait_until(granted, "the step's grant", within=20)
    request_id = step.of("granted")[0]["id"]
    await asyncio.sleep(LEASE)  # a few heartbeats go through first
    uses = len(step.of("use"))
    await asyncio.sleep(0.2)
    assert len(step.of("use")) > uses, "the step is not using its grant"
    step.proc.send_signal(signal.SIGSTOP)
    return request_id, time.monotonic()


async def _one_gpu_within_10s(c: httpx.AsyncClient, subject: str, **body: Any) -> dict[str, Any]:
    """A 1-GPU request of ``subject`` created with ``?wait=10``; the answer (201)."""
    return ok(
        await c.post(
            "/v1/requests",
            params={"wait": 10},
            json={"subject": subject, "resources": {"gpu": 1}, **body},
        ),
        201,
    )


async def _finish(step: Step, stopped: float, pause: float = PAUSE) -> None:
    await asyncio.sleep(max(0.0, stopped + pause - time.monotonic()))
    step.proc.send_signal(signal.SIGCONT)
    assert await asyncio.wait_for(step.proc.wait(), 40) == 0
    assert step.reader is not None
    await step.reader


def _after(step: Step, when: float) -> int:
    return sum(1 for e in step.of("use") if e["at"] > when)


async def test_paused_past_its_lease_expires_and_the_stale_step_changes_nothing(
    db_url: str,
) -> None:
    rounds = pick(1, 5)
    figures: dict[str, Any] = {"rounds": rounds, "stale_uses": 0, "double_uses": 0}
    stale_answers: list[str] = []
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as server:
        c = server.client
        ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
        for subject in ("step", "next"):
            ok(await c.post("/v1/policies", json={"subject": subject, "pool": "p"}), 201)
        for _ in range(rounds):
            async with step_process(server.url, "step", "p", 0) as step:
                mine, stopped = await _granted_then_frozen(step)
                nxt = await _one_gpu_within_10s(c, "next")
                # The lease lapses while the step is frozen: expired, then the GPU is re-granted.
                assert nxt["status"] == "allocated", nxt
                before = await get_request(server.client, mine)
                assert before["status"] == "expired" and before["reason"] == "lease_expired"
                # The stale step's calls (made here for it, while it is frozen) change nothing.
                for action in ("heartbeat", "release", "cancel"):
                    r = await c.post(f"/v1/requests/{mine}/{action}", params={"attempt": 1})
                    stale_answers.append(f"{action} {r.status_code} {r.json().get('status')}")
                    assert r.status_code == 200 and r.json()["status"] == "expired", r.text
                assert await get_request(server.client, mine) == before
                await _finish(step, stopped)
                after = await get_request(server.client, mine)
                assert after["status"] == "expired" and after["version"] == before["version"]
                assert (await get_request(server.client, nxt["id"]))["status"] == "allocated"
                ended = await _allocation_end(db_url, mine, 1)
                regranted = await _allocated_at(db_url, nxt["id"])
                assert regranted >= ended
                figures["stale_uses"] += _after(step, ended)
                figures["double_uses"] += _after(step, regranted)
                lost = step.of("lost")
                assert lost and lost[0]["status"] in ("allocated", "expired"), step.events[-5:]
                ok(await c.post(f"/v1/requests/{nxt['id']}/release"))
    figures["stale_answers"] = sorted(set(stale_answers))
    record("row4 expiry (SIGSTOP past the lease)", **figures)
    assert figures["stale_uses"] == 0 and figures["double_uses"] == 0


async def test_paused_past_its_lease_requeued_regranted_and_fenced(db_url: str) -> None:
    rounds = pick(1, 5)
    figures: dict[str, Any] = {"rounds": rounds, "stale_409": 0, "stale_uses": 0}
    figures["double_uses"] = 0
    step_codes: list[int] = []
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as server:
        c = server.client
        ok(await c.post("/v1/pools", json={"name": "q", "capacity": {"gpu": 1}}), 201)
        ok(
            await c.post(
                "/v1/policies", json={"subject": "owner", "pool": "q", "reserved": {"gpu": 1}}
            ),
            201,
        )
        ok(await c.post("/v1/policies", json={"subject": "borrower", "pool": "q"}), 201)
        for _ in range(rounds):
            async with step_process(server.url, "borrower", "q", 1) as step:
                mine, stopped = await _granted_then_frozen(step)
                # The owner reclaims its reserved GPU: the step's request is preempted and
                # requeued (attempt 2) ...
                owner = await _one_gpu_within_10s(c, "owner", preemptible=False)
                assert owner["status"] == "allocated", owner
                # ... and granted again once the owner is done, while the step is still frozen.
                ok(await c.post(f"/v1/requests/{owner['id']}/release"))

                async def regranted(rid: str = mine) -> bool:
                    got = await get_request(server.client, rid)
                    return bool(got["status"] == "allocated" and got["attempt"] == 2)

                await wait_until(regranted, "the requeued attempt's grant", within=10)
                before = await get_request(server.client, mine)
                for action in ("heartbeat", "release", "cancel"):
                    r = await c.post(f"/v1/requests/{mine}/{action}", params={"attempt": 1})
                    assert r.status_code == 409, r.text
                    assert r.json()["field"] == "attempt"
                    figures["stale_409"] += 1
                assert await get_request(server.client, mine) == before  # nothing changed

                async def keep_alive(rid: str = mine) -> None:
                    # Attempt 2 keeps its lease until the step wakes up (its lease is short).
                    while True:
                        ok(await c.post(f"/v1/requests/{rid}/heartbeat", params={"attempt": 2}))
                        await asyncio.sleep(LEASE / 4)

                keeper = asyncio.create_task(keep_alive())
                try:
                    await _finish(step, stopped, pause=LEASE + 0.5)
                finally:
                    keeper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await keeper
                ended = await _allocation_end(db_url, mine, 1)
                owner_at = await _allocated_at(db_url, owner["id"])
                figures["stale_uses"] += _after(step, ended)
                figures["double_uses"] += _after(step, owner_at)
                # After SIGCONT the step's own stale calls were fenced too, then it let go of
                # the requeued attempt (respool_client releases it without ?attempt).
                codes = [
                    e["code"]
                    for e in step.of("http")
                    if "attempt=1" in e["query"]
                    and e["path"].endswith(("/heartbeat", "/release"))
                    and e["at"] > ended
                ]
                step_codes.extend(codes)
                assert codes and set(codes) == {409}, step.events[-10:]
                assert (await get_request(server.client, mine))["status"] == "released"
    figures["step_stale_answers"] = sorted(set(step_codes))
    figures["step_stale_calls"] = len(step_codes)
    record("row4 requeue + re-grant (SIGSTOP past the lease)", **figures)
    assert figures["stale_uses"] == 0 and figures["double_uses"] == 0
