"""A heartbeat's ``usage`` (docs/placement.md, "Sharing a GPU"; docs/api.md): the holder of a
slice reports the MiB it uses per ``<K>_memory_mb`` key it asked. Use above the slice records
an event with reason ``over_slice`` once per crossing and shows in the gauges; when the pool's
``slice_overuse`` is ``terminate``, the holder is also terminated (reason ``over_slice``,
never requeued). Bad usage is a 400 naming ``usage.<key>`` and changes nothing.

The slices here are asked in a pool of abstract units with a ``gpu_memory_mb`` capacity: the
rules compare the use with the request's own ``gpu_memory_mb``, wherever it was placed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.http import error, make_request, ok
from support.server import Server, running_server

SLICE = 20480


async def _gauge(srv: Server, name: str) -> float | None:
    """The value of gauge ``name`` for pool nb and key gpu_memory_mb (None: no series)."""
    text = (await srv.client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == {"pool": "nb", "key": "gpu_memory_mb"}:
                return float(sample.value)
    return None


@pytest.fixture
async def srv(db_url: str) -> AsyncIterator[Server]:
    async with running_server(db_url, metrics_cache_seconds=0.0) as server:
        yield server


async def _pool(c: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    body = {"name": "nb", "capacity": {"gpu_memory_mb": 81920, "gpu_share": 100}, **fields}
    made: dict[str, Any] = ok(await c.post("/v1/pools", json=body), 201)
    ok(await c.post("/v1/policies", json={"subject": "team", "pool": "nb"}), 201)
    return made


async def _slice(c: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    made = await make_request(
        c, pool="nb", resources={"gpu_memory_mb": SLICE, "gpu_share": 50}, **body
    )
    assert made["status"] == "allocated"
    return made


async def _beat(c: httpx.AsyncClient, rid: str, used: int) -> dict[str, Any]:
    answer: dict[str, Any] = ok(
        await c.post(f"/v1/requests/{rid}/heartbeat", json={"usage": {"gpu_memory_mb": used}})
    )
    return answer


async def _over_events(c: httpx.AsyncClient, rid: str) -> list[dict[str, Any]]:
    events = ok(await c.get(f"/v1/requests/{rid}/events"))
    return [e for e in events if e["reason"] == "over_slice"]


async def test_a_pool_reports_overuse_by_default_and_says_so(srv: Server) -> None:
    c = srv.client
    assert (await _pool(c))["slice_overuse"] == "report"
    changed = ok(await c.patch("/v1/pools/nb", json={"slice_overuse": "terminate"}))
    assert changed["slice_overuse"] == "terminate"
    err = error(await c.patch("/v1/pools/nb", json={"slice_overuse": "kill"}), 400)
    assert "slice_overuse" in (err["field"] or "")
    assert ok(await c.get("/v1/pools/nb"))["slice_overuse"] == "terminate"


async def test_use_above_the_slice_is_one_event_per_crossing(srv: Server) -> None:
    c = srv.client
    await _pool(c)
    r = await _slice(c)
    rid = r["id"]
    assert (await _beat(c, rid, SLICE))["status"] == "allocated"  # at the slice: not above
    assert await _over_events(c, rid) == []

    after = await _beat(c, rid, SLICE + 1000)
    assert after["status"] == "allocated"  # report only
    (event,) = await _over_events(c, rid)
    assert (event["from"], event["to"]) == ("allocated", "allocated")
    assert f"{SLICE + 1000} MiB" in event["message"] and f"{SLICE} MiB" in event["message"]

    await _beat(c, rid, SLICE + 5000)  # still above: the same crossing
    assert len(await _over_events(c, rid)) == 1
    assert await _gauge(srv, "respool_slice_over_holders") == 1
    assert await _gauge(srv, "respool_slice_over_memory_mb") == 5000

    await _beat(c, rid, 100)  # back within it, then above again: a second crossing
    assert await _gauge(srv, "respool_slice_over_holders") == 0
    await _beat(c, rid, SLICE + 1)
    assert len(await _over_events(c, rid)) == 2

    # the event is no new grant: the allocation history still has one interval
    waits = ok(await c.get(f"/v1/requests/{rid}"))
    assert waits["status"] == "allocated"


async def test_a_terminating_pool_ends_the_holder_and_never_requeues_it(srv: Server) -> None:
    c = srv.client
    await _pool(c, slice_overuse="terminate")
    r = await _slice(c, max_retries=3)
    gone = await _beat(c, r["id"], SLICE * 2)
    assert (gone["status"], gone["reason"]) == ("preempted", "over_slice")
    assert gone["attempt"] == 1  # not requeued, whatever max_retries
    assert "over its slice" in gone["message"]
    # the overuse recorded, then the termination
    note, ended = await _over_events(c, r["id"])
    assert (note["to"], ended["to"]) == ("allocated", "preempted")
    # its units went back: another slice of the whole device fits
    big = await make_request(c, pool="nb", resources={"gpu_memory_mb": 81920})
    assert big["status"] == "allocated"


async def test_with_a_grace_period_the_holder_is_preempting_first(srv: Server) -> None:
    c = srv.client
    await _pool(c, slice_overuse="terminate", preemption_grace_seconds=60)
    r = await _slice(c)
    going = await _beat(c, r["id"], SLICE + 1)
    assert (going["status"], going["reason"]) == ("preempting", "over_slice")
    assert going["preempt_deadline"] is not None
    done = ok(await c.post(f"/v1/requests/{r['id']}/release"))
    assert done["attempt"] == 1 and done["status"] in ("preempted", "released")


async def test_within_the_slice_a_terminating_pool_keeps_the_holder(srv: Server) -> None:
    c = srv.client
    await _pool(c, slice_overuse="terminate")
    r = await _slice(c)
    assert (await _beat(c, r["id"], SLICE))["status"] == "allocated"
    # a key the request holds no slice of is not compared
    other = ok(
        await c.post(f"/v1/requests/{r['id']}/heartbeat", json={"usage": {"npu_memory_mb": 10**6}})
    )
    assert other["status"] == "allocated"


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"gpu_memory_mb": -1}, "usage.gpu_memory_mb"),
        ({"gpu": 3}, "usage.gpu"),
        ({"gpu_share": 30}, "usage.gpu_share"),
        ({"gpu_memory_mb": 1.5}, "usage.gpu_memory_mb"),
        ({"gpu_memory_mb": "20GiB"}, "usage.gpu_memory_mb"),
        ({"Gpu_memory_mb": 1}, "usage.Gpu_memory_mb"),
        ([1, 2], "usage"),
        ("lots", "usage"),
    ],
)
async def test_bad_usage_is_a_400_naming_it_and_changes_nothing(
    srv: Server, usage: object, field: str
) -> None:
    c = srv.client
    await _pool(c, slice_overuse="terminate")
    r = await _slice(c)
    before = ok(await c.get(f"/v1/requests/{r['id']}"))
    res = await c.post(f"/v1/requests/{r['id']}/heartbeat", json={"usage": usage})
    error(res, 400, field)
    after = ok(await c.get(f"/v1/requests/{r['id']}"))
    assert (after["status"], after["lease_expires_at"]) == ("allocated", before["lease_expires_at"])
    assert await _over_events(c, r["id"]) == []
