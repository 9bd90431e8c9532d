"""The same idempotency key from the same subject is the same request, also under races."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from engine_support import assert_healthy, mk_policy, mk_pool
from respool_client import wire as q

from app.db import requests as db_requests
from app.db.connect import APP_API, create_pool
from app.db.errors import IdempotencyMismatch


@pytest.fixture
async def db(conn: asyncpg.Connection) -> asyncpg.Connection:
    await mk_pool(conn, "p", {"gpu": 4})
    await mk_pool(conn, "p2", {"gpu": 4})
    await mk_policy(conn, "S", "p")
    await mk_policy(conn, "T", "p")
    return conn


BODY: dict[str, Any] = {
    "pool": "p",
    "resources": {"gpu": 1},
    "labels": {"run": "r1"},
    "lease_seconds": 60,
}


async def test_same_key_same_body_is_the_same_request(db: asyncpg.Connection) -> None:
    first = await db_requests.create_request(db, dict(subject="S", idempotency_key="k1", **BODY))
    again = await db_requests.create_request(db, dict(subject="S", idempotency_key="k1", **BODY))
    assert (first.created, again.created) == (True, False)
    assert again.request.id == first.request.id
    assert again.request.status == "allocated" and again.request.idempotency_key == "k1"
    # settings that convert to the same final map are the same body
    same = await db_requests.create_request(
        db,
        {
            "subject": "S",
            "idempotency_key": "k1",
            "pool": "p",
            "settings": {"gpu_count": 1},
            "labels": {"run": "r1"},
            "lease_seconds": 60,
        },
    )
    assert (same.created, same.request.id) == (False, first.request.id)
    assert await db.fetchval("SELECT count(*) FROM respool.requests") == 1
    await assert_healthy(db)


async def test_replay_returns_the_current_state(db: asyncpg.Connection) -> None:
    first = await db_requests.create_request(db, dict(subject="S", idempotency_key="k1", **BODY))
    await db_requests.release_request(db, first.request.id)
    again = await db_requests.create_request(db, dict(subject="S", idempotency_key="k1", **BODY))
    assert (again.created, again.request.id, again.request.status) == (
        False,
        first.request.id,
        "released",
    )


async def test_a_rejected_request_replays_too(db: asyncpg.Connection) -> None:
    body = {**BODY, "resources": {"gpu": 9}}
    first = await db_requests.create_request(db, dict(subject="S", idempotency_key="big", **body))
    again = await db_requests.create_request(db, dict(subject="S", idempotency_key="big", **body))
    assert first.request.status == "rejected"
    assert (again.created, again.request.id) == (False, first.request.id)


@pytest.mark.parametrize(
    "change",
    [
        {"resources": {"gpu": 2}},
        {"pool": "p2"},
        {"pool": None},
        {"labels": {"run": "r2"}},
        {"lease_seconds": 61},
        {"preemptible": False},
        {"max_retries": 1},
        {"settings": {"cpu_count": 1}},
    ],
    ids=lambda c: next(iter(c)),
)
async def test_same_key_other_body_is_a_mismatch(
    db: asyncpg.Connection, change: dict[str, Any]
) -> None:
    first = await db_requests.create_request(db, dict(subject="S", idempotency_key="k1", **BODY))
    with pytest.raises(IdempotencyMismatch) as err:
        await db_requests.create_request(
            db, dict(subject="S", idempotency_key="k1", **{**BODY, **change})
        )
    assert err.value.status_code == 422
    assert err.value.field == "idempotency_key"
    assert "k1" in err.value.message and str(first.request.id) in err.value.message
    assert await db.fetchval("SELECT count(*) FROM respool.requests") == 1


async def test_same_key_other_subject_is_another_request(db: asyncpg.Connection) -> None:
    s = await db_requests.create_request(db, dict(subject="S", idempotency_key="shared", **BODY))
    t = await db_requests.create_request(db, dict(subject="T", idempotency_key="shared", **BODY))
    assert s.created and t.created
    assert s.request.id != t.request.id
    assert (s.request.subject, t.request.subject) == ("S", "T")


async def test_no_key_means_a_new_request_each_time(db: asyncpg.Connection) -> None:
    a = await db_requests.create_request(db, dict(subject="S", **BODY))
    b = await db_requests.create_request(db, dict(subject="S", **BODY))
    assert a.created and b.created and a.request.id != b.request.id


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gpu", [1, 9], ids=["granted", "rejected"])
async def test_concurrent_duplicates_create_one_request(
    db: asyncpg.Connection, db_url: str, gpu: int
) -> None:
    body = {**BODY, "resources": {"gpu": gpu}}
    pool = await create_pool(db_url, size=20, application_name=APP_API)
    try:
        conns = [await pool.acquire() for _ in range(20)]  # 20 real connections, all open
        try:
            start = asyncio.Event()

            async def create(c: asyncpg.Connection) -> q.Created:
                await start.wait()
                return await db_requests.create_request(
                    c, dict(subject="S", idempotency_key="race", **body)
                )

            tasks = [asyncio.create_task(create(c)) for c in conns]
            await asyncio.sleep(0.05)
            start.set()
            results = await asyncio.gather(*tasks)
        finally:
            for c in conns:
                await pool.release(c)
    finally:
        await pool.close()
    assert await db.fetchval("SELECT count(*) FROM respool.requests") == 1
    assert len({r.request.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert {r.request.status for r in results} == {"allocated" if gpu == 1 else "rejected"}
    assert await db.fetchval("SELECT count(*) FROM respool.events") == (2 if gpu == 1 else 1)
    await assert_healthy(db)
