"""The wire vocabulary (respool_client.wire) and the migrated database agree: the status list
is the one the request state check allows (``respool._check_request_state``); the reason codes
are the literals the engine's functions pass in a reason position (read from ``pg_proc`` of the
migrated database, so a new code in SQL without its twin in Python, or the reverse, fails here);
the bounds and patterns of input values are the same constants on both sides, and match the
same values."""

from __future__ import annotations

import re

import asyncpg
import msgspec
import pytest
from respool_client import wire
from respool_client.wire import REASONS, STATUSES

# Where the engine (sql/functions) writes a reason code as a literal.
_REASON_SITES = [
    # _set_status(id, 'status', 'reason', ...), and the queue / holding exits
    r"_(?:set_status|leave_queue|end_holding)\(\s*[^,()]+,\s*'[a-z_]+',\s*'([a-z_]+)'",
    r"_clear_for_delete\(\s*'[a-z]+',\s*'([a-z_]+)'",  # pool / policy deleted
    # release / cancel: _end_request(id, attempt, 'status', reason | NULL, 'message', queued reason
    r"_end_request\((?:\s*[^,()]+,){2}\s*'[a-z_]+',\s*(?:NULL|'([a-z_]+)'),\s*'[^']*',\s*'([a-z_]+)'",
    r"_after_preemption\(\s*[^,()]+,\s*'([a-z_]+)'",  # grace expired
    r"_expire_one\(\s*[^,()]+,\s*'([a-z_]+)'",  # lease / runtime cap ran out
    r"_shed\((?:\s*[^,()]+,){3}\s*'([a-z_]+)'",  # capacity / limit shrink (pool, policy, excess)
    r"_preempt\(\s*[^,()]+,\s*'([a-z_]+)'",  # a draining node's holders
    r"reason(?:\s+text)?\s*:=\s*'([a-z_]+)'",  # v_reason := 'no_policy'
    r"coalesce\([a-z_.]*reason,\s*'([a-z_]+)'\)",  # a create's rejection: coalesce(.., 'no_policy')
    r"SELECT\s+\d+(?:\s+AS\s+rank)?,\s*key,\s*'([a-z_]+)'",  # the rejection checks, in order
    r"THEN\s+'([a-z_]+)'\s+ELSE\s+'([a-z_]+)'\s+END\s+AS\s+mode",  # preemption modes
]


async def test_statuses_are_the_ones_the_request_state_check_allows(
    conn: asyncpg.Connection,
) -> None:
    source = await conn.fetchval(
        "SELECT prosrc FROM pg_proc WHERE oid = 'respool._check_request_state()'::regprocedure"
    )
    allowed = re.search(r"NOT NEW\.status IN \(([^)]*)\)", source)
    assert allowed is not None, "the request state trigger checks no status list"
    assert set(re.findall(r"'([a-z_]+)'", allowed.group(1))) == set(STATUSES)


async def test_reason_codes_are_the_engines(conn: asyncpg.Connection) -> None:
    sources = await conn.fetch(
        "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'respool'"
    )
    in_sql: set[str] = set()
    for row in sources:
        for site in _REASON_SITES:
            for found in re.findall(site, row["prosrc"]):
                in_sql.update(f for f in ([found] if isinstance(found, str) else found) if f)
    assert len(in_sql) >= 10, in_sql
    assert in_sql == REASONS, (
        f"only in SQL: {sorted(in_sql - REASONS)}; only in Python: {sorted(REASONS - in_sql)}"
    )


# Each constant of respool_client.wire and the SQL function that is its twin.
_TWINS = {
    "MAX_AMOUNT": "_max_amount",
    "MAX_KEYS": "_max_keys",
    "MAX_SECONDS": "_max_seconds",
    "MAX_GRACE_SECONDS": "_max_grace_seconds",
    "MAX_RETRIES": "_max_retries",
    "MAX_BATCH": "_max_batch",
    "MAX_KEY_LENGTH": "_max_key_length",
    "MAX_DESCRIPTION": "_max_description",
    "INT32_MAX": "_int32_max",
    "KEY_PATTERN": "_key_pattern",
    "POOL_NAME_PATTERN": "_pool_name_pattern",
    "SUBJECT_PATTERN": "_subject_pattern",
    "MEMORY_PATTERN": "_memory_pattern",
    "MAX_DEVICE_ID": "_max_device_id",
    "LABEL_KEY_PATTERN": "_label_key_pattern",
    "LABEL_VALUE_PATTERN": "_label_value_pattern",
    "POLICY_SUBJECT_PATTERN": "_policy_subject_pattern",
    "GROUP_PATTERN": "_group_pattern",
    "HHMM_PATTERN": "_hhmm_pattern",
    "MAX_WINDOWS": "_max_windows",
    "MAX_RATE_SECONDS": "_max_rate_seconds",
}


@pytest.mark.parametrize(("constant", "function"), sorted(_TWINS.items()))
async def test_bounds_and_patterns_are_the_engines(
    conn: asyncpg.Connection, constant: str, function: str
) -> None:
    assert await conn.fetchval(f"SELECT respool.{function}()") == getattr(wire, constant)


async def test_no_check_writes_a_bound_or_pattern_itself(conn: asyncpg.Connection) -> None:
    """Every engine check goes through the named bounds: no function body but its own repeats
    a bound or pattern as a literal."""
    literals = {str(getattr(wire, c)) for c in _TWINS} - {"64", "128", "1000"}  # too common as text
    sources = await conn.fetch(
        "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'respool'"
    )
    found = [
        (row["proname"], literal)
        for row in sources
        for literal in literals
        if re.search(rf"(?<![0-9]){re.escape(literal)}(?![0-9])", row["prosrc"])
        and row["proname"] not in _TWINS.values()
    ]
    assert found == []


@pytest.mark.parametrize(
    ("pattern", "function", "values"),
    [
        ("KEY_PATTERN", "_key_pattern", ["gpu", "a" * 63, "a" * 64, "Gpu", "1x", "x-y", ""]),
        ("POOL_NAME_PATTERN", "_pool_name_pattern", ["p", "0a.b-c_d", "-a", "A", "a" * 64]),
        ("SUBJECT_PATTERN", "_subject_pattern", ["team", "a/b@c:d", "_a", "a b", "a" * 129]),
        (
            "MEMORY_PATTERN",
            "_memory_pattern",
            ["8GB", " 1.5 GiB ", "8G", "8Gi", "1gb", "1.GB", "8", "GB", "8g", "8GBi"],
        ),
        (
            "POLICY_SUBJECT_PATTERN",
            "_policy_subject_pattern",
            ["team-vision:*", "*", "a*b*", "team", "a b*", "_*", "a" * 129],
        ),
        ("GROUP_PATTERN", "_group_pattern", ["run-1", "a b", "", "a\nb", "x" * 128, "x" * 129]),
        ("HHMM_PATTERN", "_hhmm_pattern", ["00:00", "23:59", "24:00", "9:00", "12:60", "07:30"]),
    ],
)
async def test_patterns_match_the_same_values(
    conn: asyncpg.Connection, pattern: str, function: str, values: list[str]
) -> None:
    python = [re.search(getattr(wire, pattern), v) is not None for v in values]
    sql = [await conn.fetchval(f"SELECT $1 ~ respool.{function}()", v) for v in values]
    assert sql == python, values
    assert True in python and False in python


async def test_the_amount_bound_is_where_both_refuse(conn: asyncpg.Connection) -> None:
    """The engine takes MAX_AMOUNT and refuses one more, as the declared schema does."""
    top = wire.MAX_AMOUNT
    assert await conn.fetchval("SELECT respool._amount($1::text::jsonb, 'x')", str(top)) == top
    with pytest.raises(asyncpg.PostgresError, match="x must be an integer between 0 and"):
        await conn.fetchval("SELECT respool._amount($1::text::jsonb, 'x')", str(top + 1))
    msgspec.json.decode(b'{"gpu_count": %d}' % top, type=wire.ResourceSettings)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"gpu_count": %d}' % (top + 1), type=wire.ResourceSettings)
