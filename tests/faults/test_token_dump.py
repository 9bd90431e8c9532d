"""Row 8 (the part not covered elsewhere): a ``pg_dump`` of a database whose tokens were issued
and used contains no issued token, whole or in part.

Tokens of every role (and a revoked one, and ``RESPOOL_ADMIN_TOKEN``) are used against the API
with auth on, then the whole database (schema and data) is dumped with the embedded wheel's
``pg_dump``. No token, and no 12-character window of one, may appear in the dump (tokens are
stored as sha256 only). The auth matrix, the client's subject isolation and the reader role
are tests/api/test_auth.py, tests/ops/test_reader.py and tests/engine/test_reader_role.py.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest

from app.db import tokens
from faults.pg import BIN_DIR
from support.db import issue_tokens
from support.faults import record
from support.server import running_server

pytestmark = pytest.mark.faults

WINDOW = 12


async def test_pg_dump_contains_no_issued_token(db_url: str) -> None:
    env_admin = "rp_" + secrets.token_urlsafe(32)
    issued = {"env": env_admin, **await issue_tokens(db_url)}
    answers: dict[str, list[int]] = {}
    async with running_server(db_url, auth="on", admin_token=env_admin) as server:
        c = server.client
        for role, token in issued.items():
            h = {"Authorization": f"Bearer {token}"}
            codes = [
                (
                    await c.post(
                        "/v1/pools", headers=h, json={"name": role, "capacity": {"gpu": 2}}
                    )
                ).status_code,
                (await c.get("/v1/pools", headers=h)).status_code,
                (
                    await c.post(
                        "/v1/requests",
                        headers=h,
                        json={"subject": "team-a:x", "resources": {"gpu": 1}},
                    )
                ).status_code,
                (await c.get("/v1/requests", headers=h)).status_code,
            ]
            answers[role] = codes
    assert answers["revoked"] == [401] * 4
    assert answers["env"][0] == 201 and answers["admin"][0] == 201

    proc = await asyncio.create_subprocess_exec(
        str(BIN_DIR / "pg_dump"),
        "--no-owner",
        "--dbname",
        db_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    dump = out.decode()
    assert "CREATE TABLE respool.tokens" in dump and "COPY respool.tokens" in dump
    found = [
        f"{role}[{i}:{i + WINDOW}]"
        for role, token in issued.items()
        for i in range(len(token) - WINDOW + 1)
        if token[i : i + WINDOW] in dump
    ]
    hashes = sum(1 for t in issued.values() if tokens.hash_token(t) in dump)
    record(
        "row8 pg_dump has no issued token",
        tokens=len(issued),
        dump_bytes=len(out),
        token_windows_checked=sum(len(t) - WINDOW + 1 for t in issued.values()),
        found=len(found),
        stored_hashes_in_dump=hashes,
        answers=answers,
    )
    assert found == []
    assert hashes == 4  # the four issued in the database are there, hashed (not the env one)
