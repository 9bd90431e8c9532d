"""Small helpers shared by the engine rule tests (tests/engine/test_*.py).

They go through the typed wrappers of :mod:`app.db` (what the API uses) and read state
back through the ops views (what an operator would check), never through private counters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import msgspec
from respool_client import wire as q

from app.db import policies as db_policies
from app.db import pools as db_pools
from app.db import reconcile as db_reconcile
from app.db import requests as db_requests
from app.db.errors import translate
from support.db import reconcile as reconcile  # one helper for every test package


async def mk_pool(
    conn: asyncpg.Connection, name: str, capacity: Mapping[str, int], **kw: Any
) -> q.Pool:
    return await db_pools.create_pool(conn, name=name, capacity=capacity, **kw)


async def mk_policy(conn: asyncpg.Connection, subject: str, pool: str, **kw: Any) -> q.Policy:
    return await db_policies.create_policy(conn, subject=subject, pool=pool, **kw)


async def mk_gpu_node(
    conn: asyncpg.Connection,
    name: str,
    pool: str,
    kind: str,
    gpus: int,
    now: datetime | None = None,
) -> None:
    """Node ``name`` in ``pool``: GPUs "0" to ``gpus`` - 1, labelled gpu-type ``kind``;
    registered at ``now`` (None: the transaction's time, create_node's default)."""
    await conn.fetchval(
        "SELECT respool.create_node($1, p_now => coalesce($2, now()))",
        {
            "name": name,
            "pool": pool,
            "labels": {"gpu-type": kind},
            "devices": {"gpu": [str(i) for i in range(gpus)]},
        },
        now,
    )


async def mk_pool_s(conn: asyncpg.Connection, capacity: Mapping[str, int], **kw: Any) -> None:
    """Pool ``p`` (``kw``: its other settings) with a plain policy for subject ``S``."""
    await mk_pool(conn, "p", capacity, **kw)
    await mk_policy(conn, "S", "p")


async def mk_pools(
    conn: asyncpg.Connection,
    names: Iterable[str],
    capacity: Mapping[str, int],
    subjects: Iterable[str] = ("S",),
    **kw: Any,
) -> None:
    """Pools ``names``, each of ``capacity`` (``kw``: their other settings), then in each a plain
    policy for every one of ``subjects``."""
    names, subjects = list(names), list(subjects)
    for name in names:
        await mk_pool(conn, name, capacity, **kw)
    for name in names:
        for subject in subjects:
            await mk_policy(conn, subject, name)


async def mk_pools_s(conn: asyncpg.Connection, capacity: Mapping[str, int], *names: str) -> None:
    """Pools ``names``, each of ``capacity``, with a plain policy for subject ``S`` in each."""
    await mk_pools(conn, names, capacity)


async def mk_req(
    conn: asyncpg.Connection, subject: str, pool: str | None = None, **kw: Any
) -> q.Request:
    """Create a request and return it (asserting it is a new one)."""
    made = await db_requests.create_request(conn, dict(subject=subject, pool=pool, **kw))
    assert made.created
    return made.request


async def get(conn: asyncpg.Connection, request_id: UUID) -> q.Request:
    return await db_requests.get_request(conn, request_id)


async def status(conn: asyncpg.Connection, request_id: UUID) -> str:
    return (await db_requests.get_request(conn, request_id)).status


async def statuses(conn: asyncpg.Connection, *ids: UUID) -> list[str]:
    return [await status(conn, i) for i in ids]


async def pool_id(conn: asyncpg.Connection, name: str) -> UUID:
    return (await db_pools.get_pool(conn, name)).id


async def pool_usage(conn: asyncpg.Connection, pool: str) -> dict[str, dict[str, Any]]:
    """respool.pool_usage rows of one pool, by key."""
    rows = await conn.fetch(
        "SELECT key, capacity, allocated, free, queued_demand FROM respool.pool_usage"
        " WHERE pool = $1",
        pool,
    )
    return {r["key"]: dict(r) for r in rows}


async def allocated(conn: asyncpg.Connection, pool: str) -> dict[str, int]:
    """Allocated units per key of one pool (keys with 0 left out)."""
    return {k: v["allocated"] for k, v in (await pool_usage(conn, pool)).items() if v["allocated"]}


async def policy_usage(
    conn: asyncpg.Connection, pool: str, subject: str
) -> dict[str, dict[str, Any]]:
    rows = await conn.fetch(
        'SELECT key, priority, reserved, "limit", used, borrowed, np_used FROM respool.policy_usage'
        " WHERE pool = $1 AND subject = $2",
        pool,
        subject,
    )
    return {r["key"]: dict(r) for r in rows}


async def queue(conn: asyncpg.Connection, pool: str | None = None) -> list[dict[str, Any]]:
    """respool.queue rows (all pools, or one), in (pool, position) order."""
    rows = await conn.fetch(
        "SELECT pool, position, request_id, subject, resources, preemptible, priority"
        " FROM respool.queue WHERE $1::text IS NULL OR pool = $1 ORDER BY pool, position",
        pool,
    )
    return [dict(r) for r in rows]


async def queue_ids(conn: asyncpg.Connection, pool: str) -> list[UUID]:
    return [r["request_id"] for r in await queue(conn, pool)]


Ev = tuple[str | None, str, str | None]


async def events(conn: asyncpg.Connection, request_id: UUID) -> list[Ev]:
    """(from, to, reason) of a request's history, in order."""
    history = await db_requests.request_events(conn, request_id)
    return [(e.from_status, e.to_status, e.reason) for e in history]


async def assert_healthy(conn: asyncpg.Connection) -> None:
    """No broken invariant, and every request's history matches its version and status."""
    assert await db_reconcile.invariant_violations(conn) == []
    bad = await conn.fetch(
        """
        SELECT r.id, r.status, r.version, count(e.*) AS n,
               (array_agg(e.to_status ORDER BY e.id DESC))[1] AS last
          FROM respool.requests r
          -- (settling rate keys is an event but no status change: docs/rates.md)
          LEFT JOIN respool.events e ON e.request_id = r.id AND e.reason IS DISTINCT FROM 'settled'
                                    AND e.reason IS DISTINCT FROM 'overrun'
         GROUP BY r.id
        HAVING count(e.*) <> r.version OR (array_agg(e.to_status ORDER BY e.id DESC))[1] <> r.status
        """
    )
    assert [dict(b) for b in bad] == []
    # A queued request is in at least one queue (a gang member: through its gang's one entry,
    # docs/scheduling.md, unless a member still holds units after a preemption); any other is in
    # none.
    stray = await conn.fetch(
        """
        SELECT r.id, r.status FROM respool.requests r
         WHERE (r.status = 'queued' AND NOT EXISTS (
                    SELECT FROM respool.queue_entries e
                      JOIN respool.requests m ON m.id = e.request_id
                     WHERE m.id = r.id OR m.gang_id = r.gang_id)
                AND NOT EXISTS (SELECT FROM respool.requests m
                                 WHERE m.gang_id = r.gang_id AND m.status = 'preempting'))
            OR (r.status <> 'queued' AND EXISTS (SELECT FROM respool.queue_entries e
                                                  WHERE e.request_id = r.id))
        """
    )
    assert [dict(s) for s in stray] == []
    assert await partial_gangs(conn) == []


async def partial_gangs(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Gangs caught partly granted (docs/scheduling.md): a member allocated while another is
    queued, or members holding units with different grant times or pools. Empty when all is well."""
    rows = await conn.fetch(
        """
        SELECT gang_id,
               count(*) FILTER (WHERE status = 'allocated') AS allocated,
               count(*) FILTER (WHERE status = 'queued') AS queued,
               count(DISTINCT allocated_at) FILTER (WHERE holds) AS grants,
               count(DISTINCT pool_id) FILTER (WHERE holds) AS pools
          FROM (SELECT *, status IN ('allocated', 'preempting') AS holds
                  FROM respool.requests WHERE gang_id IS NOT NULL) r
         GROUP BY gang_id
        HAVING (count(*) FILTER (WHERE status = 'allocated') > 0
                AND count(*) FILTER (WHERE status = 'queued') > 0)
            OR count(DISTINCT allocated_at) FILTER (WHERE holds) > 1
            OR count(DISTINCT pool_id) FILTER (WHERE holds) > 1
        """
    )
    return [dict(r) for r in rows]


async def db_now(conn: asyncpg.Connection) -> datetime:
    return await conn.fetchval("SELECT now()")  # type: ignore[no-any-return]


async def heartbeat_at(
    conn: asyncpg.Connection,
    request_id: UUID,
    now: datetime,
    lease_seconds: int | None = None,
    attempt: int | None = None,
) -> q.Request:
    """heartbeat_request with a chosen clock (the wrapper always uses the database's); errors
    come out as the wrapper's (Conflict, BadInput, ...)."""
    try:
        doc = await conn.fetchval(
            "SELECT respool.heartbeat_request(p_id => $1, p_attempt => $2,"
            " p_lease_seconds => $3, p_now => $4)",
            request_id,
            attempt,
            lease_seconds,
            now,
        )
    except asyncpg.PostgresError as exc:
        raise (translate(exc) or exc) from exc
    return msgspec.convert(doc, q.Request, strict=False)


async def create_at(
    conn: asyncpg.Connection,
    subject: str,
    pool: str | None,
    resources: dict[str, int],
    at: datetime,
    *,
    preemptible: bool = True,
    max_seconds: int | None = None,
) -> dict[str, Any]:
    """create_request with a chosen clock (the wrapper always uses the database's); the
    request's JSON document."""
    doc: dict[str, Any] = await conn.fetchval(
        "SELECT request FROM respool.create_request(jsonb_build_object('subject', $1::text,"
        " 'pool', $2::text, 'resources', $3::jsonb, 'preemptible', $4::boolean,"
        " 'max_seconds', $5::integer), p_now => $6)",
        subject,
        pool,
        resources,
        preemptible,
        max_seconds,
        at,
    )
    return doc


async def release_at(conn: asyncpg.Connection, request_id: UUID, at: datetime) -> None:
    """release_request with a chosen clock."""
    await conn.execute("SELECT respool.release_request(p_id => $1, p_now => $2)", request_id, at)
