"""Pieces of the fault tests: short/long mode, figures and an invariant auditor.

Short mode (the default, run by ``.ci/run``) keeps every test to tens of seconds; long mode
(``RESPOOL_FAULTS=long`` or ``pytest tests/faults --faults-long``) runs the bigger counts and
durations of docs/reliability.md. Every loop here is bounded in count and time, and everything
listens on and talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from types import TracebackType
from typing import Any, TypeVar

import asyncpg

from app.db.connect import connect
from support.db import direct

__all__ = ["FIGURES", "Auditor", "long_mode", "pick", "record"]

T = TypeVar("T")

# (test, figures) of this session, printed in the terminal summary (tests/faults/conftest.py).
FIGURES: list[tuple[str, dict[str, Any]]] = []


def long_mode() -> bool:
    """True for the long runs (``RESPOOL_FAULTS=long`` or ``--faults-long``)."""
    return os.environ.get("RESPOOL_FAULTS", "").strip().lower() == "long"


def pick(short: T, long: T) -> T:
    """``short`` in short mode, ``long`` in long mode."""
    return long if long_mode() else short


def record(test: str, **figures: Any) -> None:
    """Keep a test's figures for the summary; also append them as one JSON line to
    ``$RESPOOL_FAULTS_FIGURES`` when set."""
    figures = {"mode": "long" if long_mode() else "short", **figures}
    FIGURES.append((test, figures))
    print(f"\n[faults] {test}: {json.dumps(figures, default=str)}", file=sys.stderr)
    target = os.environ.get("RESPOOL_FAULTS_FIGURES")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": test, **figures}, default=str) + "\n")


# --- the auditor -------------------------------------------------------------------------------


class Auditor:
    """Reads ``respool.invariant_violations`` in a REPEATABLE READ snapshot every ``interval``
    seconds on a connection of its own (reconnecting while the database is away)."""

    def __init__(self, dsn: str, *, interval: float = 0.2) -> None:
        self.dsn = dsn
        self.interval = interval
        self.snapshots = 0
        self.violations: list[str] = []
        self.outages = 0  # snapshots that could not be taken (database away)
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def check_once(self, conn: asyncpg.Connection) -> None:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            rows = await conn.fetch(
                "SELECT invariant, pool, subject, key, detail FROM respool.invariant_violations"
            )
        self.snapshots += 1
        self.violations.extend(
            f"{r['invariant']} {r['pool']} {r['subject']} {r['key']}: {r['detail']}" for r in rows
        )

    async def _run(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.is_closed():
                        conn = await connect(self.dsn, application_name="respool-auditor")
                    await asyncio.wait_for(self.check_once(conn), 10)
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    self.outages += 1
                    if conn is not None:
                        conn.terminate()
                    conn = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)
        finally:
            if conn is not None:
                conn.terminate()

    async def __aenter__(self) -> Auditor:
        self._task = asyncio.create_task(self._run(), name="faults-auditor")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)
        if exc_type is None:  # one last look at the final state
            async with direct(self.dsn) as conn:
                await self.check_once(conn)
