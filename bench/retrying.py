"""Calls that retry as respool-client does, for the load generators of the fan-out benches.

A 429 (the API's queue for database connections is full) and a 503 (its database is busy or
down) are retried: after ``Retry-After`` seconds when the answer says so, else after a jittered
exponential backoff. A connection closed under a request (or refused) is reopened and the call
sent again: creates carry an idempotency key, so a resent create is the same request. A call
gives up after ``retry_for`` seconds (respool-client's ``retry_for``; a sweep of thousands of
steps sets it well above the client's 60 s default). Every retry is counted by its cause.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass

from bench.rawhttp import Connection, Reply

RETRY_FOR = 600.0
RETRIED = frozenset({429, 503})
BACKOFF_BASE = 0.05
BACKOFF_MAX = 2.0
# A connection closed or reset under a request, or refused when reopened.
TRANSPORT_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError)


@dataclass(frozen=True)
class Answer(Reply):
    retry_after: float | None = None
    closes: bool = False  # the server said ``Connection: close``


class _Connection(Connection):
    async def read_reply(self) -> Answer:
        reader = self._reader
        assert reader is not None
        first = await reader.readexactly(1)
        arrived = time.perf_counter()
        head = first + await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length, retry_after, closes = 0, None, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "retry-after":
                try:
                    retry_after = max(0.0, float(value.strip()))
                except ValueError:
                    retry_after = None  # an HTTP date: fall back to the backoff
            elif name == "connection" and value.strip().lower() == "close":
                closes = True
        body = await reader.readexactly(length)
        return Answer(status, body, arrived, retry_after, closes)


class GaveUp(Exception):
    """A call still failed after ``retry_for`` seconds (its last cause in the message)."""


class RetryingConnection:
    """One keep-alive connection (reopened when the server closes it), one call at a time.

    ``counts`` gets one tally per retry cause (``"429"``, ``"503"``, ``"transport"``, and
    ``"transport <kind>"`` per exception kind), shared between the connections of a run."""

    def __init__(
        self, host: str, port: int, counts: Counter[str], *, retry_for: float = RETRY_FOR
    ) -> None:
        self.host = host
        self.port = port
        self.counts = counts
        self.retry_for = retry_for
        self._conn: _Connection | None = None

    async def open(self) -> RetryingConnection:
        conn = _Connection(self.host, self.port)
        await conn.open()
        self._conn = conn
        return self

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def call(self, method: str, target: str, body: bytes | None = None) -> Answer:
        """The first answer that is neither a 429 nor a 503; raises :class:`GaveUp` past
        ``retry_for`` seconds."""
        give_up = time.monotonic() + self.retry_for
        attempt = 0
        while True:
            wait: float | None
            try:
                if self._conn is None:
                    await self.open()
                assert self._conn is not None
                answer = await self._conn.request(method, target, body)
            except TRANSPORT_ERRORS as exc:
                problem = f"{type(exc).__name__}: {exc}"
                self.counts["transport"] += 1
                self.counts[f"transport {type(exc).__name__}"] += 1
                await self.close()
                wait = None
            else:
                assert isinstance(answer, Answer)
                if answer.closes:
                    await self.close()
                if answer.status not in RETRIED:
                    return answer
                problem = f"HTTP {answer.status}"
                self.counts[str(answer.status)] += 1
                wait = answer.retry_after
            left = give_up - time.monotonic()
            if left <= 0:
                raise GaveUp(f"{method} {target}: gave up after {attempt + 1} tries: {problem}")
            if wait is None:
                step = min(BACKOFF_MAX, BACKOFF_BASE * 2.0**attempt)
                wait = step * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not crypto
            attempt += 1
            await asyncio.sleep(min(wait, left))
