"""The harness of the concurrency storms (tests/engine/test_storm*.py): the counters every storm
keeps, the worker loop, the auditor loop and one run of workers plus auditor. What differs
between storms (the operations, which errors are expected, the audit query) is passed in."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg

from app.db.connect import APP_CLI, connect
from support.db import direct
from support.twins import install_twin


@dataclass
class StormStats:
    """What every storm counts; a storm's own class adds its fields."""

    deadline: float
    started: float = field(default_factory=time.monotonic)
    ops_duration: float = 0.0
    ops: Counter[str] = field(default_factory=Counter)
    expected_errors: Counter[str] = field(default_factory=Counter)
    deadlocks: int = 0
    unexpected: list[str] = field(default_factory=list)
    errors_sample: list[str] = field(default_factory=list)
    snapshots: int = 0
    violations: list[str] = field(default_factory=list)
    violation_kinds: Counter[str] = field(default_factory=Counter)

    def expected(self, exc: Exception) -> None:
        """An engine answer the storm allows (a lost race, a fenced attempt)."""
        self.ops["expected_error"] += 1
        self.expected_errors[type(exc).__name__] += 1

    def tallies(self) -> str:
        """The counts every storm reports, for its summary line."""
        return (
            f"expected errors {dict(self.expected_errors)}; deadlocks {self.deadlocks};"
            f" auditor snapshots {self.snapshots}, violations {len(self.violations)}"
            f" {dict(self.violation_kinds)}; unexpected {len(self.unexpected)}"
        )

    def assert_clean(self, summary: str) -> str:
        """No unexpected error, deadlock or violation; returns the context of the storm's own
        assertions: ``summary`` and samples of what went wrong."""
        context = (
            f"{summary}\nsample violations: {self.violations[:10]}\n"
            f"sample errors: {self.errors_sample[:10]}\nunexpected: {self.unexpected[:10]}"
        )
        assert not self.unexpected, context
        assert self.deadlocks == 0, context
        assert self.violations == [], context
        return context

    def record(self, found: list[str]) -> None:
        """Auditor findings, each ``"<invariant> <detail>"``."""
        for v in found:
            self.violation_kinds[v.split(" ", 1)[0]] += 1
        self.violations.extend(found)


S = TypeVar("S", bound=StormStats)
Step = Callable[[asyncpg.Connection, S, random.Random], Awaitable[str]]


async def work(
    dsn: str,
    st: S,
    seed: int,
    ready: asyncio.Barrier,
    *,
    application_name: str,
    step: Step[S],
    on_error: Callable[[S, Exception], None],
) -> None:
    """One worker: its own connection, then ``step`` (which names the op it did) until the
    deadline. Deadlocks are counted; any other error goes to ``on_error``; after 50 unexpected
    errors the worker stops."""
    rng = random.Random(seed)
    conn = await connect(dsn, application_name=application_name)
    try:
        await ready.wait()  # every connection is open before anyone starts
        while time.monotonic() < st.deadline:
            try:
                st.ops[await step(conn, st, rng)] += 1
            except asyncpg.DeadlockDetectedError as exc:
                st.deadlocks += 1
                st.errors_sample.append(f"40P01: {exc}")
            except Exception as exc:
                on_error(st, exc)
            if len(st.unexpected) > 50:
                return
    finally:
        await conn.close()


def worker(
    application_name: str, step: Step[S], on_error: Callable[[S, Exception], None]
) -> Callable[[str, S, int, asyncio.Barrier], Awaitable[None]]:
    """The worker :func:`run` starts: :func:`work` with these."""

    async def one(dsn: str, st: S, seed: int, ready: asyncio.Barrier) -> None:
        await work(
            dsn, st, seed, ready, application_name=application_name, step=step, on_error=on_error
        )

    return one


async def run(
    dsn: str,
    st: S,
    seconds: float,
    *,
    workers: int,
    worker: Callable[[str, S, int, asyncio.Barrier], Awaitable[None]],
    audit_once: Callable[[asyncpg.Connection, S], Awaitable[object]],
    period: float,
) -> S:
    """``workers`` workers and an auditor (``audit_once`` every ``period`` seconds, and once
    more on the quiet state after the last commit). The clock starts when all workers are
    connected."""
    audit_conn = await connect(dsn, application_name=APP_CLI)
    try:
        ready = asyncio.Barrier(workers + 1)
        tasks = [asyncio.create_task(worker(dsn, st, seed, ready)) for seed in range(workers)]
        await asyncio.wait_for(ready.wait(), 60)
        st.started = time.monotonic()
        st.deadline = st.started + seconds
        stop = asyncio.Event()

        async def auditor() -> None:
            while not stop.is_set():
                await audit_once(audit_conn, st)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), period)

        audit = asyncio.create_task(auditor())
        await asyncio.gather(*tasks)
        st.ops_duration = time.monotonic() - st.started
        stop.set()
        await audit
        await audit_once(audit_conn, st)  # the quiet state after the last commit
    finally:
        await audit_conn.close()
    return st


@contextlib.asynccontextmanager
async def storm_db(
    db_url: str,
    setup: Callable[[asyncpg.Connection], Awaitable[None]],
    twin: str | None = None,
) -> AsyncIterator[asyncpg.Connection]:
    """A connection to ``db_url`` after ``setup`` (and with broken ``twin`` installed)."""
    async with direct(db_url) as conn:
        await setup(conn)
        if twin:
            await install_twin(conn, twin)
        yield conn
