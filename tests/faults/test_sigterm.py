"""Row 5: SIGTERM with 1,000 open long-polls (2,000 in long mode).

A real ``respool serve`` process holds that many ``GET /v1/requests/{id}?wait=300`` on queued
requests of a full pool. On SIGTERM it must answer every one of them (200 with the current,
still queued state), reset none, and exit within a few seconds (docs/api.md).
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.faults import pick, record
from support.server import ServeProcess
from support.wait import wait_until

pytestmark = pytest.mark.faults

QUEUED = 100  # queued requests; the long-polls are spread over them


async def _waiters(client: httpx.AsyncClient) -> int:
    text = (await client.get("/metrics")).text
    m = re.search(r"^respool_waiters (\S+)$", text, re.MULTILINE)
    return int(float(m.group(1))) if m else 0


async def test_sigterm_answers_every_open_long_poll(db_url: str, tmp_path: Path) -> None:
    polls = pick(1000, 2000)
    # Waits long enough that none times out while thousands are being opened.
    server = ServeProcess(db_url, tmp_path, reconciler=False, RESPOOL_MAX_WAIT="300")
    server.start()
    try:
        await server.ready()
        limits = httpx.Limits(max_connections=polls + 50, max_keepalive_connections=polls + 50)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as c:
            r = await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}})
            assert r.status_code == 201, r.text
            r = await c.post("/v1/policies", json={"subject": "team", "pool": "p"})
            assert r.status_code == 201, r.text
            ids: list[str] = []
            for _ in range(QUEUED + 1):
                r = await c.post("/v1/requests", json={"subject": "team", "resources": {"gpu": 1}})
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            queued = ids[1:]  # the first one holds the only GPU

            async def poll(i: int) -> tuple[int, dict[str, Any], float]:
                r = await c.get(f"/v1/requests/{queued[i % QUEUED]}", params={"wait": 300})
                return r.status_code, r.json(), time.monotonic()

            opened = time.monotonic()
            tasks = [asyncio.create_task(poll(i)) for i in range(polls)]

            async def all_waiting() -> bool:
                return await _waiters(c) >= polls

            await wait_until(all_waiting, f"{polls} open long-polls", within=240, step=0.2)
            open_seconds = time.monotonic() - opened
            assert not any(t.done() for t in tasks)

            server.send(signal.SIGTERM)
            sent = time.monotonic()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            exit_code = await server.wait_exit(within=30)
            exited = time.monotonic() - sent

    finally:
        server.close()

    errors = [r for r in results if isinstance(r, BaseException)]
    answers = [r for r in results if not isinstance(r, BaseException)]
    codes: dict[int, int] = {}
    for code, _, _ in answers:
        codes[code] = codes.get(code, 0) + 1
    last_answer = max((at for _, _, at in answers), default=sent) - sent
    figures = {
        "long_polls": polls,
        "answered": len(answers),
        "status_codes": codes,
        "still_queued": sum(1 for _, body, _ in answers if body.get("status") == "queued"),
        "connection_errors": len(errors),
        "open_all_s": round(open_seconds, 2),
        "last_answer_after_sigterm_s": round(last_answer, 2),
        "exit_after_sigterm_s": round(exited, 2),
        "exit_code": exit_code,
    }
    record("row5 SIGTERM with open long-polls", **figures)
    assert errors == [], [repr(e) for e in errors[:5]]
    assert codes == {200: polls}
    assert figures["still_queued"] == polls  # answered with the current state
    assert exit_code == 0, server.log()
    # The exit itself is bounded by wait_exit(within=30) above: the waits asked for 300 s, so an
    # exit inside 30 s means they were answered, not waited out. How long it took is a figure
    # (recorded above), not a pass mark: it grows with the machine's load.
