"""The checks that run where their fields are written (a request's subject, key, lease and job;
its state: status, attempt, holder's pool, grace deadline, earmark; a counter's key; a policy's
limit and reserved share; a pool's capacity; a node's counters and devices but their use) still
refuse a bad row, with the constraint's name and SQLSTATE 23514, whether the row is inserted or
an update writes the field. A statement that writes none of a check's fields no longer runs it."""

from __future__ import annotations

from typing import Any

import asyncpg
import engine_support as es
import pytest
from respool_client import wire as q

from app.db import requests as db_requests


async def _refused(conn: asyncpg.Connection, sql: str, *args: Any) -> str:
    """The constraint a statement breaks (it must break one)."""
    with pytest.raises(asyncpg.CheckViolationError) as raised:
        await conn.execute(sql, *args)
    assert raised.value.sqlstate == "23514"
    assert raised.value.table_name in {
        "requests",
        "policy_resources",
        "pool_resources",
        "node_resources",
        "node_devices",
    }
    return raised.value.constraint_name


UPDATES = [  # (what an UPDATE writes, the constraint it breaks)
    ("requests SET subject = '-starts-with-a-dash'", "requests_subject_check"),
    ("requests SET max_retries = -1", "requests_max_retries_check"),
    ("requests SET lease_seconds = 0", "requests_lease_seconds_check"),
    ("requests SET idempotency_key = ''", "requests_idempotency_key_check"),
    ("requests SET max_seconds = 0", "requests_max_seconds_check"),
    ("requests SET node_selector = '[]'", "requests_node_selector_check"),
    ("requests SET preemption_group = E'a\\nb'", "requests_preemption_group_check"),
    ("requests SET command = '\"sleep\"'", "requests_command_check"),
    ("requests SET job_env = '[]'", "requests_job_env_check"),
    ("requests SET array_index = -1", "requests_array_index_check"),
    ("requests SET status = 'waiting'", "requests_status_check"),
    ("requests SET attempt = 0", "requests_attempt_check"),
    ("requests SET allocated_at = NULL", "holder_has_pool"),
    ("requests SET policy_id = NULL", "holder_has_pool"),
    ("requests SET status = 'preempting'", "preempting_has_deadline"),
    ("requests SET earmark_pool_id = pool_id", "earmark_only_while_queued"),
    ("requests SET earmark_node_id = gen_random_uuid()", "earmark_node_with_pool"),
    ("policy_resources SET key = 'Bad Key' WHERE key = 'gpu'", "policy_resources_key_check"),
    ("policy_resources SET reserved = -1", "policy_resources_reserved_check"),
    ('policy_resources SET "limit" = 0', "policy_resources_limit_check"),
    ("policy_resources SET configured = 3", "reserved_within_limit"),
    ("policy_resources SET reserved = 1", "reserved_in_force"),
    ("pool_resources SET key = 'Bad Key' WHERE key = 'gpu'", "pool_resources_key_check"),
    ("pool_resources SET capacity = 0", "pool_resources_capacity_check"),
]


@pytest.mark.parametrize(("assignment", "constraint"), UPDATES)
async def test_an_update_writing_a_field_checked_when_written_is_refused(
    conn: asyncpg.Connection, assignment: str, constraint: str
) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    await es.mk_policy(conn, "S", "p", limit={"gpu": 2}, reserved={"gpu": 2})
    r = await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    sql = f"UPDATE respool.{assignment}"  # noqa: S608 (the cases above; every row: one request)
    assert await _refused(conn, sql) == constraint
    assert (await es.get(conn, r.id)).status == "allocated"  # nothing changed


async def test_an_insert_of_a_bad_request_row_is_checked(conn: asyncpg.Connection) -> None:
    await es.mk_pool_s(conn, {"gpu": 2})
    r = await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    copy = (  # the same row under a new id and another subject
        "INSERT INTO respool.requests SELECT (jsonb_populate_record(r,"
        "    jsonb_build_object('id', gen_random_uuid(), 'subject', $2::text))).*"
        "  FROM respool.requests r WHERE id = $1"
    )
    assert await _refused(conn, copy, r.id, "no spaces allowed") == "requests_subject_check"
    state = (  # the same row under a new id, a good subject and a status it may not have
        "INSERT INTO respool.requests SELECT (jsonb_populate_record(r, jsonb_build_object("
        "    'id', gen_random_uuid(), 'subject', 'S3', 'status', 'waiting'))).*"
        "  FROM respool.requests r WHERE id = $1"
    )
    assert await _refused(conn, state, r.id) == "requests_status_check"
    await conn.execute(copy, r.id, "S2")  # the same row with a good subject is stored
    n = await conn.fetchval("SELECT count(*) FROM respool.requests WHERE subject = 'S2'")
    assert n == 1


async def test_a_charge_still_cannot_take_a_counter_below_zero(conn: asyncpg.Connection) -> None:
    """The invariants a grant or a release can break stay CHECKs on every update."""
    await es.mk_pool_s(conn, {"gpu": 2})
    r = await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    await db_requests.release_request(conn, r.id)
    sql = "UPDATE respool.pool_resources SET used = used - 1 WHERE key = 'gpu'"
    assert await _refused(conn, sql) == "pool_resources_used_check"


NODE_UPDATES = [  # (what an UPDATE of the node's rows writes, the constraint it breaks)
    ("node_resources SET key = 'Bad Key' WHERE key = 'mcpu'", "node_resources_key_check"),
    ("node_resources SET capacity = 0 WHERE key = 'mcpu'", "node_resources_capacity_check"),
    ("node_resources SET devices = 1 WHERE key = 'mcpu'", "devices_name_every_unit"),
    ("node_resources SET sharing = 'nvlink' WHERE key = 'gpu'", "node_resources_sharing_check"),
    ("node_resources SET device_memory_mb = 0 WHERE key = 'gpu'",
     "node_resources_device_memory_mb_check"),
    ("node_resources SET reserved_memory_mb = -1 WHERE key = 'gpu'",
     "node_resources_reserved_memory_mb_check"),
    ("node_resources SET sharing = 'mps' WHERE key = 'mcpu'", "sharing_of_named_devices"),
    ("node_resources SET device_memory_mb = 1 WHERE key = 'mcpu'",
     "device_memory_of_named_devices"),
    ("node_resources SET reserved_memory_mb = 80000 WHERE key = 'gpu'",
     "reserved_below_device_memory"),
    ("node_resources SET derived_from = 'gpu' WHERE key = 'gpu'", "derived_rows_have_no_devices"),
    ("node_devices SET device = ''", "node_devices_device_check"),
    ("node_devices SET device = repeat('x', 129)", "node_devices_device_check"),
    ("node_devices SET position = -1", "node_devices_position_check"),
    ("node_devices SET memory_mb = 0", "node_devices_memory_mb_check"),
]  # fmt: skip


async def _node_holding_a_gpu(conn: asyncpg.Connection) -> q.Request:
    """A pool with one node (a shared GPU of 80 GB and some CPU) whose GPU one request holds."""
    await es.mk_pool(conn, "p", {})
    body = {"name": "n1", "pool": "p", "devices": {"gpu": ["0"]}, "capacity": {"mcpu": 4000},
            "sharing": {"gpu": "mps"}, "device_memory_mb": {"gpu": 80000}}  # fmt: skip
    await conn.execute("SELECT respool.create_node($1)", body)
    await es.mk_policy(conn, "S", "p")
    return await es.mk_req(conn, "S", "p", resources={"gpu": 1})


@pytest.mark.parametrize(("assignment", "constraint"), NODE_UPDATES)
async def test_an_update_writing_a_node_field_checked_when_written_is_refused(
    conn: asyncpg.Connection, assignment: str, constraint: str
) -> None:
    r = await _node_holding_a_gpu(conn)
    assert (await es.get(conn, r.id)).status == "allocated"
    sql = f"UPDATE respool.{assignment}"  # noqa: S608 (the cases above)
    assert await _refused(conn, sql) == constraint
    held = await conn.fetchval(
        "SELECT count(*) FROM respool.node_devices WHERE holder_id = $1", r.id
    )
    assert held == 1  # nothing changed


INSERTS = [  # (an INSERT of one row, a value it refuses, the constraint named, a value it stores)
    ("INSERT INTO respool.pool_resources (pool_id, key, capacity)"
     " SELECT id, $1, 1 FROM respool.pools", "gpu-2", "pool_resources_key_check", "gpu_2"),
    ("INSERT INTO respool.node_resources (node_id, key, capacity)"
     " SELECT id, $1, 1 FROM respool.nodes", "Bad Key", "node_resources_key_check", "licence"),
    ("INSERT INTO respool.node_devices (node_id, key, device, position)"
     " SELECT id, 'gpu', $1, 1 FROM respool.nodes", "", "node_devices_device_check", "1"),
]  # fmt: skip


@pytest.mark.parametrize(("sql", "bad", "constraint", "good"), INSERTS)
async def test_an_insert_of_a_bad_counter_or_device_is_checked(
    conn: asyncpg.Connection, sql: str, bad: str, constraint: str, good: str
) -> None:
    await _node_holding_a_gpu(conn)
    assert await _refused(conn, sql, bad) == constraint
    await conn.execute(sql, good)


async def test_a_placement_still_cannot_break_a_device_invariant(conn: asyncpg.Connection) -> None:
    """What a placement writes (a node counter's use, a device's holder and slices) is still
    checked on every update."""
    await _node_holding_a_gpu(conn)
    assert await _refused(conn, "UPDATE respool.node_devices SET memory_used = 1000") == (
        "never_whole_and_sliced"
    )
    sql = "UPDATE respool.node_resources SET used = -1 WHERE key = 'gpu'"
    assert await _refused(conn, sql) == "node_resources_used_check"


async def test_no_table_the_engine_updates_has_a_before_update_row_trigger(
    conn: asyncpg.Connection,
) -> None:
    """A BEFORE UPDATE row trigger makes PostgreSQL lock every row an UPDATE writes, whether or
    not the trigger's column list names the update's columns: a lock and a WAL record for each
    counter a grant charges (docs/engine.md, the checks' triggers). They run after an update."""
    before_update = await conn.fetch(
        """
        SELECT t.tgrelid::regclass::text AS table_name, t.tgname
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'respool'::regnamespace AND NOT t.tgisinternal
           AND t.tgtype & 1 = 1 AND t.tgtype & 2 = 2 AND t.tgtype & 16 = 16  -- row, before, update
        """
    )
    # events are append-only: their trigger refuses every update, so none is ever written
    assert [(r["table_name"], r["tgname"]) for r in before_update] == [
        ("respool.events", "events_append_only")
    ]
