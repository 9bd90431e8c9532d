"""What-if (docs/scheduling.md): a what-if answers what a create would do now, from the real
engine in a rolled-back transaction: the answer matches a real create and the reconciler's next
pass, and no row, event or notification remains."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from engine_support import mk_policy, mk_pool, mk_req

from app.db import pools as db_pools
from app.db import reconcile as db_reconcile
from app.db import requests as db_requests
from app.db.errors import BadInput
from support.wait import wait_until

COUNT_ROWS = """
SELECT (SELECT count(*) FROM respool.requests), (SELECT count(*) FROM respool.events),
       (SELECT count(*) FROM respool.queue_entries),
       (SELECT coalesce(sum(used), 0) FROM respool.pool_resources)
"""


async def _setup(conn: asyncpg.Connection) -> None:
    await mk_pool(conn, "p", {"gpu": 4}, starvation_seconds=None)
    await mk_policy(conn, "owner", "p", reserved={"gpu": 2})
    await mk_policy(conn, "borrower", "p")
    await mk_policy(conn, "strictly", "p", limit={"gpu": 1})
    for _ in range(3):
        await mk_req(conn, "borrower", "p", resources={"gpu": 1})


CASES: dict[str, tuple[dict[str, Any], str, int]] = {
    # name: (create body, status right after the create, how many the reconciler preempts)
    "allocated": ({"subject": "borrower", "resources": {"gpu": 1}}, "allocated", 0),
    "queued": ({"subject": "borrower", "resources": {"gpu": 2}}, "queued", 0),
    "queued_reclaims": ({"subject": "owner", "resources": {"gpu": 2}}, "queued", 1),
    "rejected": ({"subject": "strictly", "resources": {"gpu": 2}}, "rejected", 0),
    "no_policy": ({"subject": "nobody", "resources": {"gpu": 1}}, "rejected", 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_what_if_matches_the_real_create_and_leaves_nothing(
    conn: asyncpg.Connection, db_url: str, case: str
) -> None:
    body, expected_status, preempts = CASES[case]
    await _setup(conn)
    listener = await asyncpg.connect(db_url)
    heard: list[str] = []
    for channel in ("respool_request", "respool_pool"):
        await listener.add_listener(
            channel, lambda _c, _pid, _channel, payload: heard.append(payload)
        )
    before = await conn.fetchrow(COUNT_ROWS)

    what = await db_requests.what_if_request(conn, dict(pool="p", **body))
    # Notifications arrive in commit order: once a later sentinel is heard, any NOTIFY of the
    # what-if would have been heard before it.
    await conn.execute("SELECT pg_notify('respool_pool', 'sentinel')")
    await wait_until(lambda: "sentinel" in heard, "the sentinel notification")
    assert await conn.fetchrow(COUNT_ROWS) == before
    assert heard == ["sentinel"]
    await listener.close()

    real = (await db_requests.create_request(conn, dict(pool="p", **body))).request
    assert what.status == real.status == expected_status
    assert (what.pool, what.queue_position, what.reason, what.message, what.resources) == (
        real.pool,
        real.queue_position,
        real.reason,
        real.message,
        real.resources,
    )
    assert what.eta == real.eta
    pool_id = (await db_pools.get_pool(conn, "p")).id
    await db_reconcile.reconcile_pool(conn, pool_id)
    victims = await conn.fetch(
        "SELECT r.id, r.subject, r.resources FROM respool.events e"
        " JOIN respool.requests r ON r.id = e.request_id"
        " WHERE e.to_status = 'preempted' AND e.cause_request_id = $1 ORDER BY e.id",
        real.id,
    )
    assert len(victims) == preempts
    assert [(v.id, v.subject, v.resources) for v in what.would_preempt] == [
        (v["id"], v["subject"], v["resources"]) for v in victims
    ]
    assert all(v.pool == "p" for v in what.would_preempt)
    if preempts:
        assert (await db_requests.get_request(conn, real.id)).status == "allocated"


async def test_what_if_input_errors_are_those_of_a_create(conn: asyncpg.Connection) -> None:
    await _setup(conn)
    with pytest.raises(BadInput) as err:
        await db_requests.what_if_request(
            conn, {"subject": "owner", "pool": "p", "resources": {"gpu": -1}}
        )
    assert err.value.field is not None and err.value.field.startswith("resources")
