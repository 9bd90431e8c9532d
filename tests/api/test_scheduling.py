"""Scheduling (docs/scheduling.md) over HTTP: pool fields, max_seconds, dry_run, eta."""

from __future__ import annotations

import pytest

from support.http import error, make_request, ok, pool_with_policy
from support.server import Server


async def test_pool_scheduling_fields_create_update_list(server: Server) -> None:
    c = server.client
    made = ok(await c.post("/v1/pools", json={"name": "a", "capacity": {"gpu": 8}}), 201)
    assert (made["starvation_seconds"], made["ordering"]) == (300, "fifo")
    made = ok(
        await c.post(
            "/v1/pools",
            json={"name": "b", "capacity": {"gpu": 8}, "starvation_seconds": None,
                  "ordering": "fair"},
        ),
        201,
    )  # fmt: skip
    assert (made["starvation_seconds"], made["ordering"]) == (None, "fair")
    patched = ok(await c.patch("/v1/pools/b", json={"starvation_seconds": 30}))
    assert (patched["starvation_seconds"], patched["ordering"]) == (30, "fair")
    patched = ok(await c.patch("/v1/pools/b", json={"description": "x"}))
    assert patched["starvation_seconds"] == 30  # absent: unchanged
    patched = ok(await c.patch("/v1/pools/b", json={"starvation_seconds": None}))
    assert patched["starvation_seconds"] is None  # explicit null: guard off
    listed = ok(await c.get("/v1/pools"))
    assert [(p["name"], p["starvation_seconds"], p["ordering"]) for p in listed] == [
        ("a", 300, "fifo"),
        ("b", None, "fair"),
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "starvation_seconds": -1}, "starvation_seconds"),
        ({"name": "x", "starvation_seconds": 1.5}, "starvation_seconds"),
        ({"name": "x", "ordering": "random"}, "ordering"),
    ],
)
async def test_bad_scheduling_fields_name_the_field(
    module_server: Server, body: dict[str, object], field: str
) -> None:
    error(await module_server.client.post("/v1/pools", json=body), 400, field)


async def test_max_seconds_and_dry_run(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 2})
    error(await c.post("/v1/requests", json={"subject": "team", "max_seconds": 0}), 400,
          "max_seconds")  # fmt: skip
    held = await make_request(c, resources={"gpu": 2}, max_seconds=600)
    assert held["status"] == "allocated" and held["max_seconds"] == 600
    assert held["run_deadline"] is not None and held["eta"] is None

    before = ok(await c.get("/v1/requests"))["items"]
    what = ok(
        await c.post("/v1/requests?dry_run=true", json={"subject": "team", "resources": {"gpu": 1}})
    )
    assert what["status"] == "queued" and what["queue_position"] == 1
    assert what["message"].startswith("waiting for gpu") and what["would_preempt"] == []
    assert "eta" in what
    assert ok(await c.get("/v1/requests"))["items"] == before  # nothing created
    real = await make_request(c, resources={"gpu": 1})
    assert (real["status"], real["queue_position"], real["message"]) == (
        what["status"],
        what["queue_position"],
        what["message"],
    )
    error(
        await c.post(
            "/v1/requests?dry_run=true", json={"subject": "team", "resources": {"gpu": -1}}
        ),
        400,
        "resources.gpu",
    )
