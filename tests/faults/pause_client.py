"""A pipeline step for tests/faults/test_client_pause.py, run as its own process.

``python tests/faults/pause_client.py URL SUBJECT POOL MAX_RETRIES LEASE``: holds one GPU with
:class:`respool_client.Respool` (heartbeats every ``LEASE / 4`` s) and, while ``grant.preempted`` is
false, "uses" it every 20 ms. It prints one JSON line per event: ``granted``, every ``use``
(wall-clock time), every HTTP answer the client got (``http``), ``lost`` and ``done``. The test
pauses it with SIGSTOP past its lease and compares its uses with the server's history.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import httpx
from respool_client import Respool

USE_EVERY = 0.02
MAX_SECONDS = 60.0  # bounded: the step gives up after this long in any case


_emitting = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    """One whole line per event: the client's thread and the step's both emit, and two
    unlocked prints can interleave into one unparsable line."""
    line = json.dumps({"event": event, **fields}) + "\n"
    with _emitting:
        sys.stdout.write(line)
        sys.stdout.flush()


class RecordingTransport(httpx.AsyncBaseTransport):
    """Prints every answer the client receives (method, path, query, status)."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        emit(
            "http",
            method=request.method,
            path=request.url.path,
            query=request.url.query.decode(),
            code=response.status_code,
            at=time.time(),
        )
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def main(url: str, subject: str, pool: str, max_retries: int, lease: int) -> None:
    with (
        Respool(url, retry_for=30, transport=RecordingTransport()) as rp,
        rp.allocate(
            subject,
            pool=pool,
            resources={"gpu": 1},
            max_retries=max_retries,
            lease_seconds=lease,
            heartbeat_interval=lease / 4,
            timeout=30,
        ) as grant,
    ):
        emit("granted", id=str(grant.request_id), attempt=grant.attempt)
        deadline = time.monotonic() + MAX_SECONDS
        while time.monotonic() < deadline:
            if grant.preempted:
                emit("lost", status=grant.status, reason=grant.reason, at=time.time())
                break
            emit("use", at=time.time())
            time.sleep(USE_EVERY)
    emit("done", at=time.time())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
