"""One create body, one answer: a body gets the same status and field alone (``POST
/v1/requests``) as it gets as a batch member (``members[0].<field>``), as docs/api.md promises,
and nothing is created either way."""

from __future__ import annotations

from typing import Any

import pytest

from support.http import ok, pool_with_policy
from support.server import Server

BATCH = "/v1/requests/batch"

BAD_BODIES: list[dict[str, Any]] = [
    {},
    {"resources": {"gpu": 1}},
    {"subject": 7},
    {"subject": "-bad subject"},
    {"subject": "team", "colour": "red"},
    {"subject": "team", "pool": 3},
    {"subject": "team", "pool": "nope"},
    {"subject": "team", "resources": {"GPU": 1}},
    {"subject": "team", "resources": {"gpu": "1"}},
    {"subject": "team", "resources": {"gpu": -1}},
    {"subject": "team", "resources": {"gpu": 2**63}},
    {"subject": "team", "resources": []},
    {"subject": "team", "settings": {"cpu_count": "1"}},
    {"subject": "team", "settings": {"cpu_count": -1}},
    {"subject": "team", "settings": {"memory": "lots"}},
    {"subject": "team", "settings": {"colour": 1}},
    {"subject": "team", "preemptible": "yes"},
    {"subject": "team", "preemptible": None},
    {"subject": "team", "max_retries": -1},
    {"subject": "team", "max_retries": 1.5},
    {"subject": "team", "max_retries": None},
    {"subject": "team", "lease_seconds": 0},
    {"subject": "team", "lease_seconds": "60"},
    {"subject": "team", "max_seconds": 31_536_001},
    {"subject": "team", "idempotency_key": ""},
    {"subject": "team", "idempotency_key": "k" * 201},
    {"subject": "team", "labels": {"": "x"}},
    {"subject": "team", "labels": {"a": 1}},
    {"subject": "team", "labels": {str(i): "x" for i in range(65)}},
    {"subject": "team", "resources": {"step_run": 1}},
    {"subject": "team", "node_selector": ["gpu-type=A100"]},
    {"subject": "team", "node_selector": {"GPU Type": "A100"}},
    {"subject": "team", "node_selector": {"gpu-type": 100}},
    {"subject": "team", "node_selector": {"gpu-type": "x" * 64}},
    {"subject": "team", "settings": {"gpu_type": "A\tB"}},
]


async def test_a_bad_node_selector_names_its_label(module_server: Server) -> None:
    c = module_server.client
    if (await c.get("/v1/pools/p")).status_code == 404:
        await pool_with_policy(c, capacity={"gpu": 8})
    bad = await c.post(
        "/v1/requests", json={"subject": "team", "node_selector": {"zone": "x" * 64}}
    )
    assert bad.status_code == 400 and bad.json()["field"] == "node_selector.zone", bad.text


async def _count(server: Server) -> int:
    return len(ok(await server.client.get("/v1/requests", params={"limit": 1000}))["items"])


@pytest.mark.parametrize("body", BAD_BODIES, ids=[str(b)[:60] for b in BAD_BODIES])
async def test_a_body_gets_the_same_error_alone_and_as_a_batch_member(
    module_server: Server, body: dict[str, Any]
) -> None:
    c = module_server.client
    if (await c.get("/v1/pools/p")).status_code == 404:  # the module's server: set up once
        await pool_with_policy(c, capacity={"gpu": 8})
    before = await _count(module_server)
    alone = await c.post("/v1/requests", json=body)
    member = await c.post(BATCH, json={"members": [body]})
    assert 400 <= alone.status_code < 500, alone.text
    assert "Traceback" not in alone.text and "Traceback" not in member.text
    single_field = alone.json()["field"]
    assert single_field, alone.text  # the offending field is named
    assert (member.status_code, member.json()["field"]) == (
        alone.status_code,
        f"members[0].{single_field}",
    ), (alone.text, member.text)
    assert await _count(module_server) == before
