"""Where a request ran stays known after it gives its units back (docs/placement.md, "Where a
request ran"): ``last_placement`` on every way a holding ends (release, cancel, preemption with a
retry left, lease expiry), ``placement`` only while it holds, and each grant's event carrying the
node and devices of that grant, so a requeued request shows every node it ran on."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from test_placement import Env

from support.placement import gpu_placement


@pytest.fixture
def env(conn: asyncpg.Connection) -> Env:
    return Env(conn)


async def _grants(env: Env, doc: dict[str, Any]) -> list[dict[str, Any] | None]:
    history = await env.conn.fetchval("SELECT respool.list_request_events($1)", doc["id"])
    return [e["placement"] for e in history if e["to"] == "allocated"]


async def test_a_preempted_request_requeued_keeps_where_it_ran_and_each_grant_is_an_event(
    env: Env,
) -> None:
    await env.pool("gpus")
    await env.node("n1", "gpus", gpus=["0", "1", "2", "3"], labels={"gpu-type": "A100-80G"})
    await env.node("n2", "gpus", gpus=["0", "1", "2", "3"])
    await env.policy("owner", "gpus", reserved={"gpu": 4})
    await env.policy("borrower", "gpus")
    body = {"subject": "borrower", "pool": "gpus", "resources": {"gpu": 4}, "max_retries": 1,
            "node_selector": {"node": "n1"}}  # fmt: skip
    victim = await env.conn.fetchval(
        "SELECT request FROM respool.create_request($1, p_now => $2)", body, env.now()
    )
    assert victim["placement"]["node"] == "n1" and victim["last_placement"] is None

    owner = await env.req("owner", "gpus", {"gpu": 4}, selector={"node": "n1"})
    assert owner["status"] == "queued"
    await env.reconcile("gpus")  # reclaim: the borrower is preempted and queued again
    now = await env.get(victim)
    assert (now["status"], now["attempt"]) == ("queued", 2)
    assert now["placement"] is None
    assert now["last_placement"] == gpu_placement(
        "n1", ["0", "1", "2", "3"], labels={"gpu-type": "A100-80G"}
    )

    # the owner goes; the borrower is granted again (on n1, its selector) and holds again
    await env.release(owner)
    again = await env.get(victim)
    assert again["status"] == "allocated" and again["last_placement"] is None
    assert again["placement"]["node"] == "n1"
    grants = await _grants(env, victim)
    assert [g["node"] if g else None for g in grants] == ["n1", "n1"]
    assert grants[0]["devices"] == {"gpu": ["0", "1", "2", "3"]}


async def test_an_expired_request_keeps_where_it_ran(env: Env) -> None:
    await env.pool("gpus")
    await env.node("n1", "gpus", gpus=["0", "1"])
    await env.policy("s", "gpus")
    body = {"subject": "s", "pool": "gpus", "resources": {"gpu": 1}, "lease_seconds": 1}
    doc = await env.conn.fetchval(
        "SELECT request FROM respool.create_request($1, p_now => $2)", body, env.now()
    )
    for _ in range(3):
        env.now()
    await env.reconcile("gpus")  # the lease lapsed
    ended = await env.get(doc)
    assert ended["status"] == "expired" and ended["placement"] is None
    assert ended["last_placement"] == gpu_placement("n1", ["0"])


@pytest.mark.parametrize(("end", "status"), [("release_request", "released"),
                                             ("cancel_request", "cancelled")])  # fmt: skip
async def test_a_released_or_cancelled_request_keeps_where_it_ran(
    env: Env, end: str, status: str
) -> None:
    await env.pool("gpus")
    await env.node("n1", "gpus", gpus=["0", "1"], labels={"gpu-type": "L4"})
    await env.policy("s", "gpus")
    doc = await env.req("s", "gpus", {"gpu": 2})
    assert doc["placement"] is not None
    ended = await env.conn.fetchval(f"SELECT respool.{end}($1)", doc["id"])
    assert ended["status"] == status and ended["placement"] is None
    assert ended["last_placement"] == gpu_placement("n1", ["0", "1"], labels={"gpu-type": "L4"})
    assert await env.get(doc) == ended  # as stored, in the status change's one row version


async def test_a_pool_without_nodes_has_no_placement_anywhere(conn: asyncpg.Connection) -> None:
    await conn.fetchval("SELECT respool.create_pool('flat', '{\"gpu\": 2}')")
    await conn.fetchval("SELECT respool.create_policy('s', 'flat')")
    doc = await conn.fetchval(
        'SELECT request FROM respool.create_request(\'{"subject": "s", "resources": {"gpu": 1}}\')'
    )
    await conn.fetchval("SELECT respool.release_request($1)", doc["id"])
    ended = await conn.fetchval("SELECT respool.get_request($1)", doc["id"])
    assert ended["placement"] is None and ended["last_placement"] is None
    history = await conn.fetchval("SELECT respool.list_request_events($1)", doc["id"])
    assert [e["placement"] for e in history] == [None] * len(history)
