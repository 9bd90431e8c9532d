"""``client.reserve(pool=..., resources={...})`` and ``r.settle(llm_tokens=used)`` (docs/rates.md),
sync and async, against a real server with its reconciler: the block runs once the window has
room, the settlement is sent with the release, a block without ``settle`` leaves the estimate,
and a refused settlement still releases the reservation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from respool_client import ApiError, AsyncRespool, Reservation, Respool, RespoolError

from support.http import ok
from support.server import Server, running_server
from support.wire import wire_request


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Server]:
    async with running_server(db_url, with_reconciler=True, reconcile_interval=10.0) as srv:
        c = srv.client
        ok(
            await c.post(
                "/v1/pools",
                json={
                    "name": "llm",
                    "capacity": {"gpu": 1},
                    "rates": {"llm_tokens": {"amount": 10_000, "per_seconds": 2}},
                },
            ),
            201,
        )
        ok(await c.post("/v1/policies", json={"subject": "team:nlp", "pool": "llm"}), 201)
        yield srv


async def tokens_used(server: Server) -> int:
    pool: dict[str, Any] = ok(await server.client.get("/v1/pools/llm"))
    used: int = pool["rates"]["llm_tokens"]["used"]
    return used


async def test_async_reserve_and_settle(live: Server) -> None:
    async with AsyncRespool(live.url, subject="team:nlp") as rp:
        async with rp.reserve(pool="llm", resources={"llm_tokens": 4000}) as r:
            assert isinstance(r, Reservation) and r.resources["llm_tokens"] == 4000
            assert await tokens_used(live) == 4000
            r.settle(llm_tokens=3120)
        assert await tokens_used(live) == 3120
        got = await rp.get_request(r.request_id)
        assert got.status == "released"
        # Without settle the estimate stays charged.
        async with rp.reserve(pool="llm", resources={"llm_tokens": 1000}):
            pass
        assert await tokens_used(live) == 4120


async def test_reserve_waits_for_the_window(live: Server) -> None:
    async with AsyncRespool(live.url, subject="team:nlp") as rp:
        async with rp.reserve(pool="llm", resources={"llm_tokens": 9000}):
            pass
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with rp.reserve(pool="llm", resources={"llm_tokens": 5000}, timeout=10) as r:
            r.settle(llm_tokens=10)
        # Granted when the first charge left its 2 s window, not at the reconciler's interval.
        assert loop.time() - start < 5


async def test_a_refused_settlement_still_releases(live: Server) -> None:
    async with AsyncRespool(live.url, subject="team:nlp") as rp:
        with pytest.raises(ApiError) as err:
            async with rp.reserve(pool="llm", resources={"gpu": 1, "llm_tokens": 10}) as r:
                r.settle(gpu=1)  # not a rate key: 400 naming used.gpu
        assert err.value.status_code == 400 and err.value.field == "used.gpu"
        assert (await rp.get_request(r.request_id)).status == "released"


async def test_sync_reserve_and_settle(live: Server) -> None:
    def step() -> dict[str, Any]:  # in a thread: the server runs in this test's event loop
        with Respool(live.url) as rp:
            with rp.reserve(subject="team:nlp", pool="llm", resources={"llm_tokens": 2500}) as r:
                r.settle(llm_tokens=2000)
            assert rp.get_request(r.request_id).status == "released"
            pool: dict[str, Any] = rp.call("GET", "/v1/pools/llm")
            return pool

    pool = await asyncio.to_thread(step)
    assert pool["rates"]["llm_tokens"]["used"] == 2000


async def test_reserve_needs_a_subject(live: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESPOOL_SUBJECT", raising=False)

    def step() -> None:
        with (
            Respool(live.url) as rp,
            pytest.raises(RespoolError, match="subject"),
            rp.reserve(pool="llm", resources={"llm_tokens": 1}),
        ):
            pass

    await asyncio.to_thread(step)


def test_settle_takes_counts_only() -> None:
    state = wire_request(
        subject="s", pool="llm", pool_id=None, resources={"llm_tokens": 5}, version=2
    )
    r = Reservation(state)
    with pytest.raises(ValueError, match="llm_tokens"):
        r.settle(llm_tokens=-1)
    r.settle(llm_tokens=3)
    assert r.used == {"llm_tokens": 3}
