"""The harness of the Hypothesis model tests (tests/engine/test_model*.py): a private event loop
for the sync state machines, and one run of a machine against a database."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.db.connect import APP_CLI, connect
from support.db import RECONCILE_POOL
from support.twins import install_twin

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class LoopThread:
    """A private event loop in a daemon thread: the sync state machine submits coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class DatabaseMachine(RuleBasedStateMachine):
    """A state machine driving the engine through one connection (set by :func:`run_machine`)."""

    runner: ClassVar[LoopThread]
    conn: ClassVar[asyncpg.Connection]
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.stats["examples"] += 1

    def sql(self, query: str, *args: Any) -> Any:
        return self.runner.run(self.conn.fetchval(query, *args))

    def reconcile_pool(self, pool: str, now: datetime) -> Any:
        """One reconciler pass over ``pool`` at ``now``."""
        return self.sql(RECONCILE_POOL, pool, now)

    def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return self.runner.run(self.conn.fetch(query, *args))

    def wipe(self) -> None:
        """A fresh universe per example. DELETE rather than TRUNCATE: with a few dozen rows it is
        ~100x faster (TRUNCATE swaps files), and Hypothesis runs hundreds of examples. The ids
        start again (:data:`MODEL_IDS`): the example's n-th row gets the same id every time."""
        self.runner.run(
            self.conn.execute(
                "DELETE FROM respool.events; DELETE FROM respool.queue_entries;"
                " DELETE FROM respool.placements; DELETE FROM respool.device_slices;"
                " DELETE FROM respool.nodes;"
                " DELETE FROM respool.requests; DELETE FROM respool.policy_resources;"
                " DELETE FROM respool.policies; DELETE FROM respool.pool_resources;"
                " DELETE FROM respool.pools; SELECT setval('respool_model.ids', 1, false);"
            )
        )


class ModelClockMachine(DatabaseMachine):
    """A machine whose clock (:meth:`now`) moves one second per call, from ``clock0``; its
    ``model`` (anything with a ``now``) keeps the same time, in seconds since ``clock0``."""

    clock0: ClassVar[datetime]
    model: Any

    def __init__(self) -> None:
        super().__init__()
        self.seq = 0

    def now(self) -> datetime:
        self.seq += 1
        self.model.now = self.seq
        return self.clock0 + timedelta(seconds=self.seq)


class NodeModelMachine(ModelClockMachine):
    """The rules the node models share: end a request (release, cancel), set a node's state,
    reconcile the pool; what differs is data: the pool, the statuses a cancel may end, the
    order requests are picked in. The ``model`` has ``requests`` (each with ``id`` and
    ``status``), ``nodes`` (each with ``state``), ``finish``, ``settle``, ``reconcile`` and
    ``stats``."""

    pool: ClassVar[str]
    cancellable: ClassVar[tuple[str, ...]] = ("queued",)
    started: bool

    def pick_key(self, r: Any) -> Any:
        return r.seq

    def _pick(self, data: st.DataObject, statuses: tuple[str, ...]) -> Any:
        found = sorted(
            (r for r in self.model.requests.values() if r.status in statuses), key=self.pick_key
        )
        return data.draw(st.sampled_from(found))

    def _end(self, data: st.DataObject, statuses: tuple[str, ...], call: str, status: str) -> None:
        r = self._pick(data, statuses)
        self.sql(f"SELECT respool.{call}(p_id => $1, p_now => $2)", r.id, self.now())
        self.model.finish(r, status)
        self.stats[call.removesuffix("_request")] += 1

    @precondition(lambda self: any(r.status == "allocated" for r in self.model.requests.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self._end(data, ("allocated",), "release_request", "released")

    @precondition(
        lambda self: any(r.status in self.cancellable for r in self.model.requests.values())
    )
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self._end(data, self.cancellable, "cancel_request", "cancelled")

    @precondition(lambda self: self.started)
    @rule(data=st.data(), state=st.sampled_from(["cordoned", "draining", "active", "active"]))
    def set_state(self, data: st.DataObject, state: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.model.nodes)))
        self.sql("SELECT respool.set_node_state($1, $2, p_now => $3)", name, state, self.now())
        node = self.model.nodes[name]
        changed = node.state != state
        node.state = state
        if changed:
            self.model.settle()
        self.stats[f"state_{state}"] += 1

    @precondition(lambda self: self.started)
    @rule()
    def reconcile(self) -> None:
        self.reconcile_pool(self.pool, self.now())
        self.model.reconcile()
        self.stats["reconcile"] += 1

    @invariant()
    def engine_matches_model(self) -> None:
        """Once started, after every step: each request's state as the engine reads it
        (``state_sql``'s ``requests``) is the model's (:meth:`model_requests`), then the rest of
        the engine's state is the model's (:meth:`check_state`)."""
        if not self.started:
            return
        self.stats["checks"] += 1
        state = self.sql(self.state_sql)
        model = self.model_requests()
        assert state["requests"] == model, self._diff(state["requests"], model)
        self.check_state(state)

    state_sql: ClassVar[str]

    def model_requests(self) -> dict[str, Any]:
        raise NotImplementedError

    def check_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _diff(self, engine: dict[str, Any], model: dict[str, Any]) -> str:
        raise NotImplementedError

    def teardown(self) -> None:
        self.stats.update(self.model.stats)


# The engine breaks ties by id wherever its orders end (queue order: queue time, then id; victim
# order: most recently allocated, then id; several grants of one pass share their instant), and
# the ids are random: the same steps could then end differently, and Hypothesis, replaying a
# prefix, would draw from a live list of another length (FlakyStrategyDefinition). In the model's
# database every id column defaulting to gen_random_uuid() takes the n-th id of a fixed
# pseudo-random series instead (md5 of n: ties still fall either way, as with random ids), and
# :meth:`DatabaseMachine.wipe` restarts the series, so an example is a function of its draws.
# The create route names its new requests (and a gang) with gen_random_uuid() itself: on the
# model's connection that name resolves to respool_model.gen_random_uuid(), the same series
# (respool_model comes before pg_catalog in its search_path).
MODEL_IDS = """
CREATE SCHEMA IF NOT EXISTS respool_model;
CREATE SEQUENCE IF NOT EXISTS respool_model.ids;
CREATE OR REPLACE FUNCTION respool_model.next_id() RETURNS uuid LANGUAGE sql AS
    $$ SELECT md5('respool model id ' || nextval('respool_model.ids'))::uuid $$;
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT t.relname, a.attname
               FROM pg_attrdef d
               JOIN pg_class t ON t.oid = d.adrelid
               JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
              WHERE t.relnamespace = 'respool'::regnamespace
                AND pg_get_expr(d.adbin, d.adrelid) = 'gen_random_uuid()' LOOP
        EXECUTE format('ALTER TABLE respool.%I ALTER COLUMN %I SET DEFAULT respool_model.next_id()',
                       c.relname, c.attname);
    END LOOP;
END $$;
CREATE OR REPLACE FUNCTION respool_model.gen_random_uuid() RETURNS uuid LANGUAGE sql AS
    $$ SELECT respool_model.next_id() $$;
SET search_path = respool_model, pg_catalog, public;
"""


def model_sizes(quick: tuple[int, int], full: tuple[int, int] = (100, 40)) -> Callable[[F], F]:
    """Parametrizes a model test with ``(examples, steps)``: "quick" keeps the model in the quick
    loop (`pytest -m "not slow"`), "full" runs many more examples and is ``slow``. On a failure
    Hypothesis shrinks for minutes (every attempt replays its steps against the database), so
    pytest-timeout allows 900 s."""

    def mark(test: F) -> F:
        sizes = [
            pytest.param(*quick, id="quick"),
            pytest.param(*full, id="full", marks=pytest.mark.slow),
        ]
        test = pytest.mark.parametrize(("examples", "steps"), sizes)(test)
        return pytest.mark.timeout(900)(test)  # type: ignore[no-any-return]

    return mark


def model_test(
    machine: type[DatabaseMachine],
    label: str,
    *,
    quick: tuple[int, int],
    full: tuple[int, int] = (100, 40),
) -> Callable[[str, int, int], None]:
    """A model test (:func:`model_sizes`) that runs ``machine`` (:func:`run_machine`)."""

    @model_sizes(quick, full)
    def test(db_url: str, examples: int, steps: int) -> None:
        run_machine(machine, db_url, examples, steps, label)

    return test


def run_machine(
    machine: type[DatabaseMachine], db_url: str, examples: int, steps: int, label: str
) -> None:
    """Runs ``machine`` as a test against ``db_url`` (a database of its own: its ids become
    :data:`MODEL_IDS`; ``RESPOOL_MODEL_TWIN`` names a broken twin, e.g. broken_shrink_twin, to
    install first: the model must catch it); its stats start empty.
    Prints ``label`` with the stats and the seconds it took."""
    runner = LoopThread()
    conn = runner.run(connect(db_url, application_name=APP_CLI))
    runner.run(conn.execute(MODEL_IDS))
    if twin := os.environ.get("RESPOOL_MODEL_TWIN"):
        runner.run(install_twin(conn, twin.removesuffix(".sql")))
    machine.runner = runner
    machine.conn = conn
    machine.stats = Counter()
    started = time.monotonic()
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        runner.run(conn.close())
        runner.close()
    print(f"\n{label}: {dict(machine.stats)} in {time.monotonic() - started:.1f}s")
