"""Coalesced creates (docs/api.md, "Coalesced creates"): concurrent single creates made by one
engine call, each with its own answer, error, idempotency key and queue place.

To make the creates meet for certain, the tests hold every connection of the server's pool while
they send them (each create then waits in the coalescer), and give the connections back once all
of them wait; real HTTP clients on a real server throughout.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from app.api.coalesce import CreateCoalescer, ReleaseCoalescer
from support.http import error, ok, pool_with_policy, team_gpu
from support.server import Server, busy_pool, running_server, waiting_clients

CREATE = "/v1/requests"


def coalescer(server: Server) -> CreateCoalescer:
    made: CreateCoalescer = server.app.state.coalescer
    return made


async def until_pending(server: Server, n: int) -> None:
    for _ in range(1000):
        made = getattr(server.app.state, "coalescer", None)
        if made is not None and made.pending >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"expected {n} pending creates")


async def together(
    server: Server,
    bodies: list[dict[str, Any]],
    *,
    params: dict[str, Any] | None = None,
    in_order: bool = False,
) -> list[httpx.Response]:
    """POST every body at once, each on its own connection, while the pool is busy: all wait in
    the coalescer before any is made. ``in_order``: each reaches the coalescer before the next is
    sent, so their arrival order is that of ``bodies``. The answers, in the order of ``bodies``."""
    await warm(server)
    limits = httpx.Limits(max_connections=len(bodies) + 1, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as c:
        async with busy_pool(server):
            tasks = []
            for i, b in enumerate(bodies, start=1):
                tasks.append(asyncio.create_task(c.post(CREATE, json=b, params=params)))
                if in_order:
                    await until_pending(server, i)
            await until_pending(server, len(bodies))
        return list(await asyncio.gather(*tasks))


async def warm(server: Server) -> None:
    """One create, so the app has its coalescer (made on first use) before the counts."""
    if getattr(server.app.state, "coalescer", None) is None:
        ok(await server.client.post(CREATE, json={"subject": "warm", "resources": {"gpu": 1}}), 201)


async def test_a_lone_create_is_one_single_create(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 2})
    await warm(server)
    made = coalescer(server)
    singles, batches = made.singles, made.batches
    r = ok(await c.post(CREATE, json=team_gpu(labels={"a": "b"})), 201)
    assert r["status"] == "allocated" and r["labels"] == {"a": "b"}
    assert (made.singles, made.batches) == (singles + 1, batches)
    assert ok(await c.get(f"{CREATE}/{r['id']}")) == r
    # A dry run is never coalesced (nor kept).
    what = ok(await c.post(CREATE, json=team_gpu(), params={"dry_run": "true"}))
    assert what["status"] == "allocated" and (made.singles, made.batches) == (singles + 1, batches)
    assert len(ok(await c.get(CREATE, params={"subject": "team"}))["items"]) == 1


async def test_200_concurrent_creates_each_get_their_own_answer(server: Server) -> None:
    await pool_with_policy(server.client, capacity={"gpu": 150})
    bodies = [team_gpu(labels={"i": str(i)}) for i in range(200)]
    answers = await together(server, bodies)
    docs = [ok(r, 201) for r in answers]
    assert [d["labels"]["i"] for d in docs] == [str(i) for i in range(200)]
    assert len({d["id"] for d in docs}) == 200
    # Arrival order is creation order: the first 150 fit, the last 50 queue in order.
    assert [d["status"] for d in docs] == ["allocated"] * 150 + ["queued"] * 50
    assert [d["queue_position"] for d in docs[150:]] == list(range(1, 51))
    made = coalescer(server)
    assert made.batches >= 1 and made.largest == 200
    for d in docs[::37]:  # each answer is the request as the API reads it
        assert ok(await server.client.get(f"{CREATE}/{d['id']}"))["id"] == d["id"]


async def test_creates_of_several_subjects_are_made_subject_by_subject(server: Server) -> None:
    """One call made for creates of two subjects that arrived interleaved: each subject's creates
    in their arrival order, the subject whose first create came first made first."""
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 2})
    ok(await c.post("/v1/policies", json={"subject": "other", "pool": "p"}), 201)
    bodies = [
        team_gpu(subject=s, labels={"i": str(i)}) for i, s in enumerate(["team", "other"] * 2)
    ]
    answers = await together(server, bodies, in_order=True)
    assert coalescer(server).largest >= 4
    docs = [ok(r, 201) for r in answers]
    assert [d["labels"]["i"] for d in docs] == ["0", "1", "2", "3"]  # each gets its own answer
    got = {d["labels"]["i"]: (d["status"], d["queue_position"]) for d in docs}
    assert got == {
        "0": ("allocated", None),
        "2": ("allocated", None),
        "1": ("queued", 1),
        "3": ("queued", 2),
    }


async def test_an_invalid_member_gets_a_single_creates_error(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    unknown = team_gpu(pool="nope")
    ok(await c.post(CREATE, json=team_gpu(idempotency_key="taken")), 201)
    mismatch = team_gpu(idempotency_key="taken", labels={"other": "body"})
    expected = [
        error(await c.post(CREATE, json=b), s) for b, s in ((unknown, 404), (mismatch, 422))
    ]
    before = len(ok(await c.get(CREATE, params={"limit": 1000}))["items"])
    bodies = [team_gpu(labels={"i": str(i)}) for i in range(6)]
    bodies[1:1] = [unknown]
    bodies[5:5] = [mismatch]
    answers = await together(server, bodies)
    assert [r.status_code for r in answers] == [201, 404, 201, 201, 201, 422, 201, 201]
    assert answers[1].json() == expected[0] and answers[5].json() == expected[1]
    assert "members[" not in answers[1].text + answers[5].text
    made = [r.json() for r in answers if r.status_code == 201]
    assert [d["labels"]["i"] for d in made] == [str(i) for i in range(6)]
    after = len(ok(await c.get(CREATE, params={"limit": 1000}))["items"])
    assert after == before + 6


async def test_a_member_refused_by_an_earlier_member_gets_its_single_creates_error(
    server: Server,
) -> None:
    """A key first used by an earlier create of the same call: the create that reuses it with
    another body gets the 422 its single create gets right after the first, naming that request."""
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    first_body = team_gpu(idempotency_key="shared", labels={"who": "first"})
    other_body = team_gpu(idempotency_key="shared", labels={"who": "other"})
    answers = await together(server, [first_body, other_body, team_gpu()])
    first = ok(answers[0], 201)
    refused = error(answers[1], 422, "idempotency_key")
    ok(answers[2], 201)
    assert refused == error(await c.post(CREATE, json=other_body), 422, "idempotency_key")
    assert first["id"] in refused["detail"]
    page = ok(await c.get(CREATE, params={"subject": "team", "limit": 1000}))
    assert {d["id"] for d in page["items"]} == {first["id"], answers[2].json()["id"]}


async def test_idempotent_retries_racing_their_original(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 8})
    bodies = [team_gpu(idempotency_key=f"k{i}", labels={"i": str(i)}) for i in range(10)]
    answers = await together(server, [b for b in bodies for _ in range(2)])
    for i in range(10):
        first, retry = answers[2 * i], answers[2 * i + 1]
        assert (first.status_code, retry.status_code) == (201, 200)
        assert first.json()["id"] == retry.json()["id"]
        assert first.json()["labels"] == {"i": str(i)}
    # Racing in separate calls too: one request per key, whatever the interleaving.
    limits = httpx.Limits(max_connections=40)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as h:
        again = await asyncio.gather(*(h.post(CREATE, json=b) for b in bodies * 3))
    assert {r.status_code for r in again} == {200}
    assert {r.json()["id"] for r in again} == {r.json()["id"] for r in answers}
    page = ok(await c.get(CREATE, params={"subject": "team", "limit": 1000}))
    assert len(page["items"]) == 10


async def test_queue_order_is_arrival_order_and_waits_go_on(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 1})
    holder = ok(await c.post(CREATE, json=team_gpu()), 201)
    await warm(server)
    limits = httpx.Limits(max_connections=20, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as h:
        async with busy_pool(server):
            tasks = []
            for i in range(12):  # one after the other: each waits in line before the next
                params = {"wait": 10} if i == 0 else None
                body = team_gpu(labels={"i": str(i)})
                tasks.append(asyncio.create_task(h.post(CREATE, json=body, params=params)))
                await until_pending(server, i + 1)
        rest = await asyncio.gather(*tasks[1:])
        assert [r.json()["labels"]["i"] for r in rest] == [str(i) for i in range(1, 12)]
        assert [ok(r, 201)["queue_position"] for r in rest] == list(range(2, 13))
        # The first still waits (?wait=), queued first: a release grants it and answers it.
        await waiting_clients(server, 1)
        assert not tasks[0].done()
        ok(await c.post(f"{CREATE}/{holder['id']}/release"))
        first = ok(await tasks[0], 201)
    assert first["labels"] == {"i": "0"} and first["status"] == "allocated"


async def test_creates_keep_coming_while_a_batch_runs(db_url: str) -> None:
    """No pool held: creates arriving in waves while calls run, on a small pool."""
    async with running_server(db_url, db_pool_size=2) as server:
        await pool_with_policy(server.client, capacity={"gpu": 1000})
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as h:

            async def one(i: int) -> dict[str, Any]:
                await asyncio.sleep((i % 10) * 0.005)
                r = await h.post(CREATE, json=team_gpu(labels={"i": str(i)}))
                return ok(r, 201)  # type: ignore[no-any-return]

            docs = await asyncio.gather(*(one(i) for i in range(300)))
        assert [d["labels"]["i"] for d in docs] == [str(i) for i in range(300)]
        assert {d["status"] for d in docs} == {"allocated"}
        page = ok(await server.client.get(CREATE, params={"limit": 1000}))
        assert len(page["items"]) == 300


async def test_concurrent_releases_each_get_their_own_answer_and_error(server: Server) -> None:
    c = server.client
    await pool_with_policy(c, capacity={"gpu": 20})
    held = [ok(await c.post(CREATE, json=team_gpu()), 201) for _ in range(12)]
    waiting = ok(await c.post(CREATE, json=team_gpu(resources={"gpu": 20})), 201)
    assert waiting["status"] == "queued"
    calls = [(f"{CREATE}/{r['id']}/release", {}) for r in held[:10]]
    calls.append((f"{CREATE}/{held[10]['id']}/release", {"attempt": 2}))  # stale attempt
    calls.append((f"{CREATE}/00000000-0000-4000-8000-000000000000/release", {}))  # unknown
    limits = httpx.Limits(max_connections=len(calls) + 1, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
        async with busy_pool(server):
            tasks = [asyncio.create_task(client.post(u, params=p)) for u, p in calls]
            for _ in range(1000):  # every release waits in line before any is made
                made = getattr(server.app.state, "release_coalescer", None)
                if made is not None and made.pending >= len(calls):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the releases never met")
        answers = await asyncio.gather(*tasks)
    made = server.app.state.release_coalescer
    assert made.batches >= 1 and made.largest >= 2
    for r, a in zip(held[:10], answers[:10], strict=True):
        body = ok(a, 200)
        assert (body["id"], body["status"]) == (r["id"], "released")
    assert "stale attempt" in error(answers[10], 409, "attempt")["detail"]
    assert "not found" in error(answers[11], 404, "id")["detail"]
    still = ok(await c.get(f"{CREATE}/{held[10]['id']}"), 200)
    assert still["status"] == "allocated"  # its refused release changed nothing
    assert ok(await c.get(f"{CREATE}/{held[11]['id']}"), 200)["status"] == "allocated"
    # ten units back, two still held: the 20-GPU request waits on
    assert ok(await c.get(f"{CREATE}/{waiting['id']}"), 200)["status"] == "queued"


async def test_a_pool_closing_under_a_flusher_fails_the_waiting_calls_instead_of_hanging() -> None:
    """asyncpg takes a connection back when its pool closes; the flusher holding it must not die
    with the calls still waiting (their handlers would hang): they get the pool's error."""

    class Released:
        def is_closed(self) -> bool:
            raise asyncpg.InterfaceError("connection has been released back to the pool")

    class ClosingPool:
        acquired = 0

        def get_max_size(self) -> int:
            return 4

        async def acquire(self, timeout: float | None = None) -> Released:  # noqa: ASYNC109
            self.acquired += 1
            if self.acquired > 1:
                raise asyncpg.InterfaceError("pool is closed")
            return Released()

        async def release(self, conn: object) -> None:
            raise asyncpg.InterfaceError("connection has been released back to the pool")

    releases = ReleaseCoalescer(ClosingPool())  # type: ignore[arg-type]
    call = releases.release(uuid.uuid4(), None)
    with pytest.raises(asyncpg.InterfaceError, match="pool is closed"):
        await asyncio.wait_for(call, 5)
    assert releases.pending == 0
