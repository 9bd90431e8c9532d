"""Rejections at creation (docs/admission.md): stored as `rejected` with a reason and a message."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from engine_support import (
    allocated,
    assert_healthy,
    events,
    mk_policy,
    mk_pool,
    mk_req,
    queue,
    status,
)

from app.db import requests as db_requests
from app.db.errors import NotFound


@pytest.fixture
async def db(conn: asyncpg.Connection) -> asyncpg.Connection:
    """Pool p: gpu 8, mcpu 16000 (memory_mb and step_run untracked).
    team: reserved gpu 2 / mcpu 1000, limit gpu 4 / memory_mb 5000 (untracked soft key)."""
    await mk_pool(conn, "p", {"gpu": 8, "mcpu": 16000})
    await mk_pool(conn, "other", {"gpu": 8})
    await mk_policy(
        conn, "team", "p", reserved={"gpu": 2, "mcpu": 1000}, limit={"gpu": 4, "memory_mb": 5000}
    )
    return conn


@pytest.mark.parametrize(
    ("subject", "pool", "kwargs", "reason", "in_message"),
    [
        ("nobody", None, {}, "no_policy", ["nobody", "no policy"]),
        ("team", "other", {}, "no_policy", ["team", "other"]),
        ("team", "p", {"resources": {"tpu": 1}}, "pool_missing_key", ["tpu", "p"]),
        (
            "team",
            "p",
            {"resources": {"licence_x": 1, "gpu": 99}},
            "pool_missing_key",
            ["licence_x"],
        ),
        ("team", "p", {"resources": {"gpu": 9}}, "exceeds_capacity", ["gpu", "9", "8"]),
        (
            "team",
            "p",
            {"settings": {"cpu_count": 16.001}},
            "exceeds_capacity",
            ["mcpu", "16001", "16000"],
        ),
        ("team", "p", {"resources": {"gpu": 5}}, "exceeds_limit", ["gpu", "5", "4"]),
        # a limit on an untracked soft key still caps the subject
        (
            "team",
            "p",
            {"settings": {"memory": "6GB"}},
            "exceeds_limit",
            ["memory_mb", "6000", "5000"],
        ),
        (
            "team",
            "p",
            {"resources": {"gpu": 3}, "preemptible": False},
            "exceeds_reserved",
            ["gpu", "3", "2", "non-preemptible"],
        ),
        # mcpu is tracked and only 1000 are reserved
        (
            "team",
            "p",
            {"settings": {"cpu_count": 1.5}, "preemptible": False},
            "exceeds_reserved",
            ["mcpu", "1500", "1000"],
        ),
    ],
)
async def test_rejected_at_creation(
    db: asyncpg.Connection,
    subject: str,
    pool: str | None,
    kwargs: dict[str, Any],
    reason: str,
    in_message: list[str],
) -> None:
    r = await mk_req(db, subject, pool, **kwargs)
    assert (r.status, r.reason) == ("rejected", reason)
    for part in in_message:
        assert part in r.message
    assert r.finished_at is not None and r.queue_position is None
    # stored, readable, with its history, and it took nothing
    again = await db_requests.get_request(db, r.id)
    assert (again.status, again.reason, again.message) == ("rejected", reason, r.message)
    assert await events(db, r.id) == [(None, "rejected", reason)]
    assert await queue(db) == []
    assert await allocated(db, "p") == {}
    await assert_healthy(db)


@pytest.mark.parametrize(
    ("kwargs", "resources"),
    [
        ({"resources": {"gpu": 4}}, {"gpu": 4, "step_run": 1}),  # at the limit
        ({"resources": {"gpu": 2}, "preemptible": False}, {"gpu": 2, "step_run": 1}),  # = reserved
        ({"settings": {"memory": "5GB"}}, {"memory_mb": 5000, "step_run": 1}),  # = soft limit
        # memory_mb is untracked by p: unbounded at the pool layer, also for non-preemptible work
        ({"resources": {"memory_mb": 10**6}, "preemptible": True}, None),
        ({"settings": {"memory": "4GB"}, "preemptible": False}, {"memory_mb": 4000, "step_run": 1}),
        ({"settings": {"cpu_count": 16}}, {"mcpu": 16000, "step_run": 1}),  # = capacity, borrowed
    ],
)
async def test_admissible_requests_are_granted(
    db: asyncpg.Connection, kwargs: dict[str, Any], resources: dict[str, int] | None
) -> None:
    if resources is None:  # no limit on memory_mb for this subject
        await mk_policy(db, "free", "p")
        r = await mk_req(db, "free", "p", **kwargs)
    else:
        r = await mk_req(db, "team", "p", **kwargs)
        assert r.resources == resources
    assert (r.status, r.reason, r.pool) == ("allocated", None, "p")
    await assert_healthy(db)


async def test_unknown_pool_is_not_found_and_not_stored(db: asyncpg.Connection) -> None:
    with pytest.raises(NotFound) as err:
        await db_requests.create_request(db, {"subject": "team", "pool": "nope"})
    assert "nope" in err.value.message
    assert await db.fetchval("SELECT count(*) FROM respool.requests") == 0


async def test_limit_on_untracked_step_run_caps_requests(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 8})
    await mk_policy(conn, "team", "p", limit={"step_run": 2})
    r1, r2, r3 = [await mk_req(conn, "team", "p") for _ in range(3)]
    assert [r1.status, r2.status, r3.status] == ["allocated", "allocated", "queued"]
    assert "step_run" in r3.message and "limit" in r3.message
    usage = await conn.fetchrow(
        'SELECT used, "limit", borrowed FROM respool.policy_usage'
        " WHERE pool = 'p' AND subject = 'team' AND key = 'step_run'"
    )
    assert dict(usage) == {"used": 2, "limit": 2, "borrowed": 0}
    # the pool itself does not track step_run: capacity and free are null
    row = await conn.fetchrow(
        "SELECT capacity, allocated, free FROM respool.pool_usage"
        " WHERE pool = 'p' AND key = 'step_run'"
    )
    assert dict(row) == {"capacity": None, "allocated": 2, "free": None}
    await db_requests.release_request(conn, r1.id)
    assert await status(conn, r3.id) == "allocated"
    await assert_healthy(conn)


@pytest.mark.parametrize(
    ("capacity", "reserved", "expected_status", "expected_reason"),
    [
        # The pool tracks step_run, so a non-preemptible request needs reserved step_run too
        # (rule 3 read literally: every tracked key of the request, and step_run is one).
        ({"gpu": 8, "step_run": 10}, {"gpu": 2}, "rejected", "exceeds_reserved"),
        ({"gpu": 8, "step_run": 10}, {"gpu": 2, "step_run": 1}, "allocated", None),
        # Without step_run capacity the key is untracked and needs no reservation.
        ({"gpu": 8}, {"gpu": 2}, "allocated", None),
    ],
)
async def test_non_preemptible_and_tracked_step_run(
    conn: asyncpg.Connection,
    capacity: dict[str, int],
    reserved: dict[str, int],
    expected_status: str,
    expected_reason: str | None,
) -> None:
    await mk_pool(conn, "p", capacity)
    await mk_policy(conn, "team", "p", reserved=reserved)
    r = await mk_req(conn, "team", "p", resources={"gpu": 1}, preemptible=False)
    assert (r.status, r.reason) == (expected_status, expected_reason)
    if expected_reason:
        assert "step_run" in r.message
    await assert_healthy(conn)


async def test_reserved_step_run_bounds_non_preemptible_runs(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 8, "step_run": 10})
    await mk_policy(conn, "team", "p", reserved={"gpu": 4, "step_run": 1})
    first = await mk_req(conn, "team", "p", resources={"gpu": 1}, preemptible=False)
    second = await mk_req(conn, "team", "p", resources={"gpu": 1}, preemptible=False)
    assert (first.status, second.status) == ("allocated", "queued")
    assert "step_run" in second.message and "non-preemptible" in second.message
    np_used = await conn.fetchval("SELECT np_used FROM respool.policy_usage WHERE key = 'step_run'")
    assert np_used == 1
    await db_requests.release_request(conn, first.id)
    assert await status(conn, second.id) == "allocated"
    await assert_healthy(conn)


async def test_first_failing_rule_is_reported(conn: asyncpg.Connection) -> None:
    """pool_missing_key, exceeds_capacity, exceeds_limit, exceeds_reserved: the table's order."""
    await mk_pool(conn, "p", {"gpu": 8, "tpu": 2})
    await mk_policy(conn, "team", "p", reserved={"gpu": 1}, limit={"gpu": 6, "tpu": 1})
    cases = [
        ({"gpu": 9, "tpu": 3, "fpga": 1}, "pool_missing_key"),
        ({"gpu": 7, "tpu": 3}, "exceeds_capacity"),
        ({"gpu": 7, "tpu": 1}, "exceeds_limit"),
        ({"gpu": 2, "tpu": 1}, "exceeds_reserved"),
    ]
    for resources, reason in cases:
        r = await mk_req(conn, "team", "p", resources=resources, preemptible=False)
        assert (r.status, r.reason) == ("rejected", reason), resources
