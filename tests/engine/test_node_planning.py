"""Planning in a pool with nodes (docs/placement.md): the ETA of a queued request counts only the
units that free up on nodes it may use, and what-if names the victims on the node the
reconciler would preempt on."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
from engine_support import db_now, mk_gpu_node, mk_policy, mk_pool, release_at


async def two_nodes(conn: asyncpg.Connection) -> None:
    """Pool gpus backed by an A100 node and an H100 node of 8 GPUs each."""
    await mk_pool(conn, "gpus", {}, starvation_seconds=None)
    for name, kind in (("a100-1", "A100"), ("h100-1", "H100")):
        await mk_gpu_node(conn, name, "gpus", kind, gpus=8)


async def create(
    conn: asyncpg.Connection, subject: str, gpu: int, at: datetime, **body: Any
) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        await conn.fetchval(
            "SELECT request::text FROM respool.create_request($1::jsonb, p_now => $2)",
            {"subject": subject, "pool": "gpus", "resources": {"gpu": gpu}} | body,
            at,
        )
    )
    return doc


async def eta(conn: asyncpg.Connection, request_id: str) -> dict[str, int]:
    doc = json.loads(await conn.fetchval("SELECT respool.request_json($1)::text", UUID(request_id)))
    assert doc["status"] == "queued", doc
    assert doc["eta"] is not None, doc
    return dict(doc["eta"])


async def test_eta_waits_for_a_node_the_request_may_use(conn: asyncpg.Connection) -> None:
    await two_nodes(conn)
    await mk_policy(conn, "s", "gpus")
    now = await db_now(conn)
    # Recorded holds: five of 10 s and five of 1000 s (ten: the fewest an ETA is drawn from).
    start = now - timedelta(hours=6)
    for i, hold in enumerate((10, 1000) * 5):
        r = await create(conn, "s", 8, start + timedelta(seconds=2000 * i))
        await release_at(conn, UUID(r["id"]), start + timedelta(seconds=2000 * i + hold))
    # The A100 node's holder started 500 s ago: of the recorded holds only the 1000 s ones are
    # longer, so it is expected to end in about 500 s. The H100 node's holder started 1 s ago
    # and is expected to end in about 9 s.
    old = await create(conn, "s", 8, now - timedelta(seconds=500), node_selector={"node": "a100-1"})
    young = await create(conn, "s", 8, now - timedelta(seconds=1), node_selector={"node": "h100-1"})
    assert old["placement"]["node"] == "a100-1" and young["placement"]["node"] == "h100-1"

    a100 = await create(conn, "s", 8, now, settings={"gpu_type": "A100"})
    assert a100["node_selector"] == {"gpu-type": "A100"}
    # The H100 node frees first, but the request may only use the A100 node.
    assert 480 <= (await eta(conn, a100["id"]))["p50_seconds"] <= 510

    await conn.execute("SELECT respool.cancel_request($1)", UUID(a100["id"]))
    anywhere = await create(conn, "s", 8, now)
    assert (await eta(conn, anywhere["id"]))["p50_seconds"] <= 10


async def test_what_if_names_victims_on_the_node_it_would_use(conn: asyncpg.Connection) -> None:
    await two_nodes(conn)
    await mk_policy(conn, "borrower", "gpus")
    await mk_policy(conn, "owner", "gpus", reserved={"gpu": 8})
    now = await db_now(conn)
    on_a100 = await create(conn, "borrower", 8, now - timedelta(seconds=20))
    on_h100 = await create(conn, "borrower", 8, now - timedelta(seconds=10))
    assert {on_a100["placement"]["node"], on_h100["placement"]["node"]} == {"a100-1", "h100-1"}
    h100_holder = on_a100 if on_a100["placement"]["node"] == "h100-1" else on_h100

    ask = {"subject": "owner", "pool": "gpus", "resources": {"gpu": 8}}
    ask["node_selector"] = {"gpu-type": "H100"}
    doc = json.loads(await conn.fetchval("SELECT respool.what_if_request($1::jsonb)::text", ask))
    assert doc["status"] == "queued"
    # Reclaim on the only node it may use: the H100 node's holder, not the later A100 one.
    assert [v["id"] for v in doc["would_preempt"]] == [h100_holder["id"]]
    # Nothing of the what-if remains.
    statuses = await conn.fetch("SELECT status FROM respool.requests WHERE subject = 'borrower'")
    assert [r["status"] for r in statuses] == ["allocated", "allocated"]
