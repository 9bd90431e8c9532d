"""What a long-poll reads (docs/api.md: ``wait``/``version``): while it waits, only the
version and status; for the answer, the full document, encoded once and sent as it is, the same
bytes a plain GET answers; 404 for an unknown id; no lost wake-up around the version read."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx
import pytest

from app.api.reader import RequestReader
from app.api.requests import _reader
from app.notify import Waiter
from support.http import error, make_request, ok, pool_with_policy
from support.server import Server, waiting_clients


def _reader_of(server: Server) -> RequestReader:
    return _reader(server.app.state, server.app.state.db)


async def _held_pool(server: Server, units: int) -> dict[str, Any]:
    """Pool ``p`` of ``units`` GPUs, all held by one request (the answer)."""
    await pool_with_policy(server.client, capacity={"gpu": units})
    return await make_request(server.client, resources={"gpu": units})


async def _plain(server: Server, request_id: object) -> httpx.Response:
    return await server.client.get(f"/v1/requests/{request_id}")


def _long_poll(server: Server, request_id: object, **params: Any) -> asyncio.Task[httpx.Response]:
    return asyncio.create_task(
        server.client.get(f"/v1/requests/{request_id}", params={"wait": 10, **params})
    )


def _without_eta(doc: dict[str, Any]) -> dict[str, Any]:
    """A queued request's ETA is counted from now: two reads may differ by a second."""
    return {k: v for k, v in doc.items() if k != "eta"}


async def test_a_current_version_answers_the_full_document_on_timeout(server: Server) -> None:
    holder = await _held_pool(server, 1)
    queued = await make_request(server.client, resources={"gpu": 1})
    got = ok(
        await server.client.get(
            f"/v1/requests/{queued['id']}", params={"wait": 1, "version": queued["version"]}
        )
    )
    plain = ok(await _plain(server, queued["id"]))
    assert got["status"] == "queued" and got["version"] == queued["version"]
    assert got["queue_position"] == 1 and got["message"].startswith("waiting for gpu")
    assert _without_eta(got) == _without_eta(plain)
    assert holder["status"] == "allocated"


@pytest.mark.parametrize("with_version", [True, False])
async def test_a_current_version_answers_the_full_document_on_change(
    server: Server, with_version: bool
) -> None:
    holder = await _held_pool(server, 1)
    queued = await make_request(server.client, resources={"gpu": 1})
    params = {"version": queued["version"]} if with_version else {}
    task = _long_poll(server, queued["id"], **params)
    await waiting_clients(server, 1)
    assert not task.done()
    ok(await server.client.post(f"/v1/requests/{holder['id']}/release"))
    answer = await task
    doc = ok(answer)
    assert doc["status"] == "allocated" and doc["version"] > queued["version"]
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == (await _plain(server, queued["id"])).content  # byte for byte


async def test_a_create_that_waits_answers_the_full_document(server: Server) -> None:
    holder = await _held_pool(server, 1)
    body = {"subject": "team", "resources": {"gpu": 1}, "idempotency_key": "k"}
    task = asyncio.create_task(server.client.post("/v1/requests", params={"wait": 10}, json=body))
    await waiting_clients(server, 1)
    ok(await server.client.post(f"/v1/requests/{holder['id']}/release"))
    answer = await task
    doc = ok(answer, 201)
    assert doc["status"] == "allocated"
    assert answer.content == (await _plain(server, doc["id"])).content
    again = await server.client.post("/v1/requests", params={"wait": 10}, json=body)  # a replay
    assert again.status_code == 200 and again.content == answer.content


@pytest.mark.parametrize("params", [{"wait": 5, "version": 1}, {"wait": 5}, {}])
async def test_an_unknown_id_is_404_with_or_without_wait(
    server: Server, params: dict[str, int]
) -> None:
    missing = uuid.uuid4()
    r = await server.client.get(f"/v1/requests/{missing}", params=params)
    body = error(r, 404, "id")
    assert str(missing) in body["detail"]
    assert server.notifier.waiting == 0


async def test_a_burst_of_woken_waiters_each_get_their_own_document(server: Server) -> None:
    """One release grants N queued requests, each long-polled twice: every long-poll answers
    its own request, allocated, byte for byte what a plain GET answers; the documents are read
    in batches (fewer reads than answers)."""
    n = 30
    holder = await _held_pool(server, n)
    queued = [await make_request(server.client, resources={"gpu": 1}) for _ in range(n)]
    tasks = [
        _long_poll(server, q["id"], version=q["version"]) for q in queued for _copy in range(2)
    ]
    await waiting_clients(server, 2 * n)
    reads = _reader_of(server).answer
    before = reads.batches
    ok(await server.client.post(f"/v1/requests/{holder['id']}/release"))
    answers = await asyncio.gather(*tasks)
    assert reads.batches - before < 2 * n
    for i, q in enumerate(queued):
        first, second = answers[2 * i], answers[2 * i + 1]
        doc = ok(first)
        assert doc["id"] == q["id"] and doc["status"] == "allocated"
        assert first.content == second.content == (await _plain(server, q["id"])).content


async def test_a_change_committed_right_after_the_version_read_is_seen(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release commits (and its notification arrives) after the waiter read the old
    version and before it waits: registered first, the waiter is woken at once."""
    holder = await _held_pool(server, 1)
    queued = await make_request(server.client, resources={"gpu": 1})
    notified = asyncio.Event()
    server.notifier.observe(lambda _pid, payload: queued["id"] in payload and notified.set())
    seen = _reader_of(server).seen
    read = seen._fetch
    released = False

    async def read_then_release(ids: list[uuid.UUID]) -> Any:
        nonlocal released
        found = await read(ids)
        if not released and uuid.UUID(queued["id"]) in ids:
            released = True
            conn = await asyncpg.connect(server.db_url)
            try:
                await conn.execute("SELECT respool.release_request(p_id => $1)", holder["id"])
            finally:
                await conn.close()
            await notified.wait()  # the wake-up has been delivered: the waiter reads stale
        return found

    monkeypatch.setattr(seen, "_fetch", read_then_release)
    woken: list[bool] = []
    monkeypatch.setattr(Waiter, "wait", _recorded(woken))
    doc = ok(await _long_poll(server, queued["id"], version=queued["version"]))
    assert released and doc["status"] == "allocated"
    assert woken == [True]  # the notification woke it: not the backstop, not the timeout


async def test_a_lost_notification_is_caught_by_the_backstop(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notifications wake nobody here: the process's backstop read sees the new version and
    wakes the waiter (before its wait times out)."""
    holder = await _held_pool(server, 1)
    queued = await make_request(server.client, resources={"gpu": 1})
    monkeypatch.setattr(server.notifier, "wake", lambda *_args: None)
    woken: list[bool] = []
    monkeypatch.setattr(Waiter, "wait", _recorded(woken))
    task = _long_poll(server, queued["id"], version=queued["version"])
    await waiting_clients(server, 1)
    ok(await server.client.post(f"/v1/requests/{holder['id']}/release"))
    doc = ok(await task)
    assert doc["status"] == "allocated" and woken == [True]


def _recorded(woken: list[bool]) -> Callable[[Waiter, float], Awaitable[bool]]:
    """``Waiter.wait`` that also appends what each wait returned (True: woken) to ``woken``."""
    wait = Waiter.wait

    async def recorded(self: Waiter, seconds: float) -> bool:
        woken.append(await wait(self, seconds))
        return woken[-1]

    return recorded


async def test_a_notification_is_only_a_hint(server: Server) -> None:
    """A payload that claims a new version (anyone may NOTIFY) does not answer the wait: the
    document read for the answer still has the old version, so the waiter waits on."""
    holder = await _held_pool(server, 1)
    queued = await make_request(server.client, resources={"gpu": 1})
    task = _long_poll(server, queued["id"], version=queued["version"])
    await waiting_clients(server, 1)
    answers = _reader_of(server).answer
    fetch = answers._fetch
    read = asyncio.Event()

    async def recorded(ids: list[uuid.UUID]) -> Any:
        found = await fetch(ids)
        read.set()
        return found

    answers._fetch = recorded  # type: ignore[method-assign]
    forged = f'{{"id": "{queued["id"]}", "status": "allocated", "version": 99, "pool": "p"}}'
    conn = await asyncpg.connect(server.db_url)
    try:
        await conn.execute("SELECT pg_notify('respool_request', $1)", forged)
    finally:
        await conn.close()
    await read.wait()  # the forged hint made it read the document: still queued, version 1
    ok(await server.client.post(f"/v1/requests/{holder['id']}/release"))
    doc = ok(await task)
    assert doc["status"] == "allocated" and doc["version"] not in (queued["version"], 99)
