"""The checks of the fields a status change never writes (a request's subject, key, lease and
job; a counter's key; a policy's limit and reserved share; a pool's capacity) still refuse a bad
row, with the constraint's name and SQLSTATE 23514, whether the row is inserted or an update
writes the field. Only a status change or a charge no longer runs them."""

from __future__ import annotations

from typing import Any

import asyncpg
import engine_support as es
import pytest

from app.db import requests as db_requests


async def _refused(conn: asyncpg.Connection, sql: str, *args: Any) -> str:
    """The constraint a statement breaks (it must break one)."""
    with pytest.raises(asyncpg.CheckViolationError) as raised:
        await conn.execute(sql, *args)
    assert raised.value.sqlstate == "23514"
    assert raised.value.table_name in {"requests", "policy_resources", "pool_resources"}
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
    ("policy_resources SET key = 'Bad Key'", "policy_resources_key_check"),
    ("policy_resources SET reserved = -1, configured = -1", "policy_resources_reserved_check"),
    ('policy_resources SET "limit" = 0', "policy_resources_limit_check"),
    ("policy_resources SET configured = 3", "reserved_within_limit"),
    ("policy_resources SET reserved = 1", "reserved_in_force"),
    ("pool_resources SET key = 'Bad Key'", "pool_resources_key_check"),
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
    await conn.execute(copy, r.id, "S2")  # the same row with a good subject is stored
    n = await conn.fetchval("SELECT count(*) FROM respool.requests WHERE subject = 'S2'")
    assert n == 1


async def test_an_insert_of_a_bad_counter_key_is_checked(conn: asyncpg.Connection) -> None:
    await es.mk_pool(conn, "p", {"gpu": 4})
    sql = (
        "INSERT INTO respool.pool_resources (pool_id, key, capacity)"
        " SELECT id, $1, 1 FROM respool.pools"
    )
    assert await _refused(conn, sql, "gpu-2") == "pool_resources_key_check"
    await conn.execute(sql, "gpu_2")


async def test_a_charge_still_cannot_take_a_counter_below_zero(conn: asyncpg.Connection) -> None:
    """The invariants a grant or a release can break stay CHECKs on every update."""
    await es.mk_pool_s(conn, {"gpu": 2})
    r = await es.mk_req(conn, "S", "p", resources={"gpu": 1})
    await db_requests.release_request(conn, r.id)
    sql = "UPDATE respool.pool_resources SET used = used - 1 WHERE key = 'gpu'"
    assert await _refused(conn, sql) == "pool_resources_used_check"
