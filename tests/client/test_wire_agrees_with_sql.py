"""The wire vocabulary (respool_client.wire) and the migrated database agree: the status list
is the CHECK constraint of ``respool.requests.status``; the reason codes are the literals the
engine's functions pass in a reason position (read from ``pg_proc`` of the migrated database,
so a new code in SQL without its twin in Python, or the reverse, fails here)."""

from __future__ import annotations

import re

import asyncpg
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
    r"reason(?:\s+text)?\s*:=\s*'([a-z_]+)'",  # v_reason := 'no_policy'
    r"SELECT\s+\d+(?:\s+AS\s+rank)?,\s*key,\s*'([a-z_]+)'",  # the rejection checks, in order
    r"THEN\s+'([a-z_]+)'\s+ELSE\s+'([a-z_]+)'\s+END\s+AS\s+mode",  # preemption modes
]


async def test_statuses_are_the_check_constraint(conn: asyncpg.Connection) -> None:
    definition = await conn.fetchval(
        """
        SELECT pg_get_constraintdef(c.oid)
          FROM pg_constraint c
         WHERE c.conrelid = 'respool.requests'::regclass AND c.contype = 'c'
           AND pg_get_constraintdef(c.oid) LIKE '%status = ANY%'
        """
    )
    assert definition is not None, "no CHECK on respool.requests.status"
    in_sql = set(re.findall(r"'([a-z_]+)'::text", definition))
    assert in_sql == set(STATUSES)


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
