"""Row 7: bad input changes nothing and never answers 5xx.

* oversized bodies (over ``MAX_BODY_BYTES``, with and without ``Content-Length``) → 413 on every
  route that takes a body;
* absurd numbers (2^63, negative, floats, 1e308, strings) and 10,000-key maps, in bodies and
  query parameters → 4xx with the error shape;
* nothing changed in the database by any rejected call: an md5 of every row of every base
  table is the same before and after (``support.db.database_fingerprint``).

Schemathesis against the OpenAPI document runs in tests/api/test_schemathesis.py (short, every
check); the long mode here runs it with 100 examples per operation.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.api import MAX_BODY_BYTES
from support.db import database_fingerprint
from support.faults import long_mode, record
from support.fuzz import schemathesis_on_a_server
from support.http import ok
from support.server import Server, running_server

pytestmark = pytest.mark.faults

BIG = 2**63
TEN_THOUSAND = {f"k{i}": 1 for i in range(10_000)}
LABELS_10K = {f"k{i}": "v" for i in range(10_000)}
ABSURD = [BIG, 2**64, -1, -(2**63) - 1, 1.5, 1e308, "1", True, None]


def _absurd_calls(request_id: str, policy_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, httpx kwargs) of calls that must all be refused with 4xx."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    for n in ABSURD:
        calls += [
            ("POST", "/v1/pools", {"json": {"name": "x", "capacity": {"gpu": n}}}),
            ("POST", "/v1/pools", {"json": {"name": "x", "capacity": {"gpu": 1},
                                            "preemption_grace_seconds": n}}),
            ("PATCH", "/v1/pools/p", {"json": {"capacity": {"gpu": n}}}),
            ("POST", "/v1/policies", {"json": {"subject": "x", "pool": "p",
                                               "reserved": {"gpu": n}}}),
            ("PATCH", f"/v1/policies/{policy_id}", {"json": {"limit": {"gpu": n}}}),
            ("POST", "/v1/requests", {"json": {"subject": "team", "resources": {"gpu": n}}}),
            ("POST", "/v1/requests", {"json": {"subject": "team", "resources": {"gpu": 1},
                                               "lease_seconds": n if n is not None else 0}}),
            ("POST", "/v1/requests", {"json": {"subject": "team", "resources": {"gpu": 1},
                                               "max_retries": n}}),
            ("POST", "/v1/requests", {"json": {"subject": "team",
                                               "settings": {"gpu_count": n}}}),
        ]  # fmt: skip
    for n in ABSURD:
        if n != -1:  # a negative priority is fine
            calls.append(("POST", "/v1/policies", {"json": {"subject": "x", "pool": "p",
                                                             "priority": n}}))  # fmt: skip
    calls += [
        ("POST", "/v1/pools", {"json": {"name": "x", "capacity": TEN_THOUSAND}}),
        ("PATCH", "/v1/pools/p", {"json": {"capacity": TEN_THOUSAND}}),
        ("POST", "/v1/policies", {"json": {"subject": "x", "pool": "p", "limit": TEN_THOUSAND}}),
        ("POST", "/v1/requests", {"json": {"subject": "team", "resources": TEN_THOUSAND}}),
        ("POST", "/v1/requests", {"json": {"subject": "team", "resources": {"gpu": 1},
                                           "labels": LABELS_10K}}),
        ("POST", "/v1/requests", {"json": {"subject": "team",
                                           "settings": {"cpu_count": 1e308}}}),
        ("POST", "/v1/requests", {"json": {"subject": "team",
                                           "settings": {"memory": "9" * 400 + "PB"}}}),
        ("POST", "/v1/requests", {"json": {"subject": "team",
                                           "settings": {"pool_resources": TEN_THOUSAND}}}),
        ("POST", "/v1/requests", {"params": {"wait": -1},
                                  "json": {"subject": "team", "resources": {"gpu": 1}}}),
        ("POST", "/v1/requests", {"params": {"wait": "nan"},
                                  "json": {"subject": "team", "resources": {"gpu": 1}}}),
        ("POST", f"/v1/requests/{request_id}/heartbeat", {"params": {"attempt": BIG}}),
        ("POST", f"/v1/requests/{request_id}/release", {"params": {"attempt": -1}}),
        ("POST", f"/v1/requests/{request_id}/cancel", {"params": {"attempt": 1.5}}),
        ("POST", f"/v1/requests/{request_id}/release", {"params": {"attempt": 2**31}}),
        ("GET", "/v1/requests", {"params": {"limit": BIG}}),
        ("GET", "/v1/requests", {"params": {"limit": -1}}),
        ("GET", f"/v1/requests/{request_id}", {"params": {"wait": "1e309"}}),
        ("DELETE", "/v1/pools/p", {"params": {"force": "maybe"}}),
        ("DELETE", f"/v1/requests/{request_id}", {}),  # not terminal: 409
        ("POST", "/v1/retention/prune", {"json": {"older_than": "-1d"}}),
        ("POST", "/v1/apply", {"json": {"pools": [{"name": "x", "capacity": {"gpu": BIG}}]}}),
    ]  # fmt: skip
    return calls


@dataclass
class Live:
    """An API with a pool, a policy and a request, and its database's fingerprint before the
    test's calls."""

    server: Server
    request_id: str
    policy_id: str
    before: dict[str, str]


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Live]:
    async with running_server(db_url) as server:
        c = server.client
        ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 4}}), 201)
        policy = ok(await c.post("/v1/policies", json={"subject": "team", "pool": "p"}), 201)
        req = ok(
            await c.post("/v1/requests", json={"subject": "team", "resources": {"gpu": 1}}), 201
        )
        yield Live(server, req["id"], policy["id"], await database_fingerprint(db_url))


async def test_oversized_bodies_are_413_and_change_nothing(live: Live, db_url: str) -> None:
    c, request_id, policy_id = live.server.client, live.request_id, live.policy_id
    routes = [
        ("POST", "/v1/pools"),
        ("PATCH", "/v1/pools/p"),
        ("POST", "/v1/policies"),
        ("PATCH", f"/v1/policies/{policy_id}"),
        ("POST", "/v1/requests"),
        ("POST", "/v1/apply"),
        ("POST", "/v1/retention/prune"),
    ]
    body = json.dumps({"description": "x" * (MAX_BODY_BYTES + 1)}).encode()
    as_json = {"content-type": "application/json"}
    codes: Counter[int] = Counter()
    for method, path in routes:
        r = await c.request(method, path, content=body, headers=as_json)
        codes[r.status_code] += 1
        assert r.status_code == 413, (method, path, r.text[:200])
        assert r.json()["status_code"] == 413

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(MAX_BODY_BYTES // 65536 + 2):
                yield b" " * 65536

        r = await c.request(method, path, content=chunks(), headers=as_json)
        codes[r.status_code] += 1
        assert r.status_code == 413, (method, path, "chunked", r.text[:200])
    assert await database_fingerprint(db_url) == live.before
    ok(await c.get(f"/v1/requests/{request_id}"))
    record(
        "row7 oversized bodies",
        limit_bytes=MAX_BODY_BYTES,
        calls=sum(codes.values()),
        answers=dict(codes),
        database_changed=False,
    )


async def test_absurd_numbers_are_4xx_and_change_nothing(live: Live, db_url: str) -> None:
    c, request_id, policy_id = live.server.client, live.request_id, live.policy_id
    codes: Counter[int] = Counter()
    bad: list[str] = []
    calls = _absurd_calls(request_id, policy_id)
    for method, path, kw in calls:
        r = await c.request(method, path, **kw)
        codes[r.status_code] += 1
        shaped = r.headers.get("content-type", "").startswith("application/json") and isinstance(
            r.json().get("detail"), str
        )
        if not 400 <= r.status_code < 500 or not shaped:
            bad.append(f"{method} {path} {str(kw)[:120]} -> {r.status_code} {r.text[:200]}")
    after = await database_fingerprint(db_url)
    changed = sorted(t for t in live.before if live.before[t] != after[t])
    record(
        "row7 absurd numbers",
        calls=len(calls),
        answers=dict(sorted(codes.items())),
        not_4xx=len(bad),
        tables_changed=changed,
    )
    assert bad == [], bad[:10]
    assert changed == []


@pytest.mark.skipif(not long_mode(), reason="long mode only (short: tests/api/test_schemathesis)")
async def test_schemathesis_100_examples_per_operation(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="respool")
    code, report = await schemathesis_on_a_server(
        db_url, tmp_path, examples=100, seed=20261123, within=1800
    )
    tested = re.search(r"Tested: (\d+)", report)
    cases = re.search(r"(\d+) generated, (\d+) passed", report)
    server_errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    record(
        "row7 schemathesis (--checks all, 100 examples per operation)",
        operations=tested.group(1) if tested else None,
        generated=cases.group(1) if cases else None,
        passed=cases.group(2) if cases else None,
        server_errors=len(server_errors),
        exit_code=code,
    )
    assert code == 0, report[-8000:]
    assert cases and cases.group(1) == cases.group(2)
    assert server_errors == []
