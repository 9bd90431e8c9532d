"""Hardening at the edges: each test fails without its fix (docs/reliability.md,
"Hardening"): names never shadow ids, the open mode, append-only history."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from app.api import create_app
from app.api.edge import is_loopback_host
from app.api.server import ApiServer, RateLimitedLog, raise_nofile_limit, uvicorn_config
from app.db import tokens
from app.settings import Settings, SettingsError
from support.db import direct
from support.http import error, ok
from support.server import Server, running_server, serving
from support.wait import wait_until

JSON = {"content-type": "application/json"}
ADMIN = "hardening-admin-token-0123456789abcdef"


async def _sql(db_url: str, statement: str, *args: Any) -> Any:
    async with direct(db_url) as conn:
        return await conn.fetch(statement, *args)


# --- 1. open mode: no cross-site requests ----------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True), ("127.0.0.1:8080", True), ("localhost:1", True), ("LOCALHOST", True),
        ("[::1]", True), ("[::1]:8080", True), ("evil.example", False),
        ("127.0.0.1.evil.example", False), ("localhost:80x", False), ("[::1]x", False),
        ("", False), ("10.0.0.1:8080", False),
    ],
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


async def _cross_site_refused(srv: Server) -> None:
    c = srv.client
    # The attack of the review: a no-cors fetch posts text/plain JSON with prune and force.
    body = b'{"name": "evil", "capacity": {"gpu": 1}}'
    error(await c.post("/v1/pools", content=body, headers={"content-type": "text/plain"}), 415)
    error(await c.post("/v1/pools", content=body), 415)  # a Blob body: no Content-Type at all
    foreign = {**JSON, "origin": "https://evil.example"}
    error(await c.post("/v1/pools", content=body, headers=foreign), 403)
    error(await c.get("/v1/pools", headers={"origin": "null"}), 403)
    rebound = {**JSON, "host": f"evil.example:{srv.url.rsplit(':', 1)[1]}"}
    error(await c.post("/v1/pools", content=body, headers=rebound), 403)
    error(await c.get("/v1/pools", headers={"host": "evil.example"}), 403)
    assert ok(await c.get("/v1/pools")) == []  # nothing was created
    # The operator's own tools still work: loopback Host, same-origin Origin, JSON.
    same = {**JSON, "origin": srv.url, "host": srv.url.removeprefix("http://")}
    ok(await c.post("/v1/pools", content=body, headers=same), 201)
    port = srv.url.rsplit(":", 1)[1]
    ok(await c.get("/v1/pools", headers={"host": f"localhost:{port}"}))


async def test_auth_off_refuses_cross_site_requests(db_url: str) -> None:
    async with running_server(db_url) as srv:
        await _cross_site_refused(srv)


async def test_bootstrap_refuses_cross_site_requests_until_a_token_exists(db_url: str) -> None:
    async with running_server(db_url, auth="on") as srv:
        await _cross_site_refused(srv)
        async with direct(db_url) as conn:
            token, _ = await tokens.create_token(conn, name="ops", role="admin")
        # Not open any more: a token decides, and a foreign Host alone is no longer refused.
        bearer = {"authorization": f"Bearer {token}", "host": "respool.internal"}
        ok(await srv.client.get("/v1/pools", headers=bearer))


async def test_non_json_bodies_are_refused_with_auth_on_after_authentication(
    db_url: str,
) -> None:
    async with running_server(db_url, auth="on", admin_token=ADMIN) as srv:
        c = srv.client
        body = b'{"name": "p", "capacity": {"gpu": 1}}'
        error(await c.post("/v1/pools", content=body, headers={"content-type": "text/plain"}), 401)
        admin = {"authorization": f"Bearer {ADMIN}"}
        plain = {**admin, "content-type": "text/plain"}
        error(await c.post("/v1/pools", content=body, headers=plain), 415)
        ok(await c.post("/v1/pools", content=body, headers={**admin, **JSON}), 201)


# --- 5. history survives a request's deletion ------------------------------------------------


async def test_deleting_a_request_keeps_its_history_until_retention(server: Server) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 2}}), 201)
    ok(await c.post("/v1/policies", json={"subject": "team", "pool": "p"}), 201)
    req = ok(await c.post("/v1/requests", json={"subject": "team", "resources": {"gpu": 1}}), 201)
    assert req["status"] == "allocated"
    ok(await c.post(f"/v1/requests/{req['id']}/release"))
    ok(await c.delete(f"/v1/requests/{req['id']}"), 204)
    rid = uuid.UUID(req["id"])
    events = await _sql(
        server.db_url, "SELECT to_status FROM respool.request_events WHERE request_id = $1", rid
    )
    assert [e["to_status"] for e in events][-2:] == ["allocated", "released"]
    usage = await _sql(server.db_url, "SELECT subject, pool, key FROM respool.usage_by_subject_day")
    assert ("team", "p", "gpu") in [tuple(r) for r in usage]
    # Only retention removes history.
    later = datetime.now(UTC) + timedelta(days=1)
    await _sql(server.db_url, "SELECT respool.prune_requests($1)", later)
    assert not await _sql(
        server.db_url, "SELECT 1 FROM respool.request_events WHERE request_id = $1", rid
    )
    assert not await _sql(server.db_url, "SELECT 1 FROM respool.usage_by_subject_day")


# --- 7. deeply nested JSON -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/pools"), ("PATCH", "/v1/pools/nested"), ("POST", "/v1/policies"),
        ("POST", "/v1/requests"), ("POST", "/v1/apply"), ("POST", "/v1/retention/prune"),
    ],
)  # fmt: skip
async def test_deeply_nested_json_is_400(
    module_server: Server, method: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    pool = {"name": "nested", "capacity": {"gpu": 1}}
    if (await module_server.client.get("/v1/pools/nested")).status_code == 404:
        ok(await module_server.client.post("/v1/pools", json=pool), 201)  # the PATCH's target
    body = b'{"name":' + b"[" * 990 + b"]" * 990 + b"}"
    with caplog.at_level(logging.WARNING):
        r = await module_server.client.request(method, path, content=body, headers=JSON)
    error(r, 400)
    assert "Traceback" not in caplog.text


# --- 8. /metrics: cached and protectable -----------------------------------------------------


async def test_metrics_database_gauges_are_cached(db_url: str) -> None:
    async with running_server(db_url, metrics_cache_seconds=60.0) as srv:
        bodies = await asyncio.gather(*(srv.client.get("/metrics") for _ in range(8)))
        assert all(b.status_code == 200 for b in bodies)
        assert all("respool_database_up 1.0" in b.text for b in bodies)
        assert srv.app.state.metrics_cache.refreshes == 1


async def test_metrics_token(db_url: str) -> None:
    token = "metrics-scraper-token-0123456789abcdef"
    async with running_server(db_url, metrics_token=token) as srv:
        error(await srv.client.get("/metrics"), 401)
        error(await srv.client.get("/metrics", headers={"authorization": "Bearer nope"}), 401)
        r = await srv.client.get("/metrics", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200 and "respool_build_info" in r.text


# --- 9. slow clients, connection and long-poll caps ------------------------------------------


@contextlib.asynccontextmanager
async def guarded_server(db_url: str, **limits: Any) -> AsyncIterator[int]:
    """The API with ``respool serve``'s uvicorn configuration (:func:`uvicorn_config`)."""
    settings = Settings(database_url=db_url, db_pool_size=2, auth="off", **limits)
    app = create_app(settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn_config(app, settings, log_level="warning", access_log=False)
    try:
        async with serving(ApiServer(config, app), sock) as port:
            yield port
    finally:
        sock.close()


async def _closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def _healthz_answers(port: int) -> None:
    """A normal client on a fresh connection gets its 200."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(r.read(), 20)).startswith(b"HTTP/1.1 200")
    finally:
        w.close()
        await w.wait_closed()


async def test_slow_headers_and_bodies_are_timed_out(db_url: str) -> None:
    async with guarded_server(db_url, header_timeout=0.5, body_timeout=0.5) as port:
        # Headers dribbled, never finished.
        r1, w1 = await asyncio.open_connection("127.0.0.1", port)
        w1.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        # Connected, nothing sent.
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        # Headers complete, body dribbled.
        r3, w3 = await asyncio.open_connection("127.0.0.1", port)
        w3.write(
            b"POST /v1/pools HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        for w in (w1, w3):
            await w.drain()
        closed = await asyncio.gather(*(_closed_by_server(r, 20) for r in (r1, r2, r3)))
        for w in (w1, w2, w3):
            w.close()
        assert closed == [True, True, True]
        # A normal client is unaffected.
        await _healthz_answers(port)


async def test_an_oversized_incomplete_head_is_refused(db_url: str) -> None:
    async with guarded_server(db_url) as port:
        # More than 16 KiB of headers, never finished: 400 and closed.
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: " + b"a" * 10_000)
        await w.drain()
        await asyncio.sleep(0.2)
        w.write(b"a" * 10_000)
        await w.drain()
        answer = await asyncio.wait_for(r.read(), 20)
        w.close()
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b"connection: close" in answer.lower()
        # A head of 12 KiB in parts is still answered.
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: " + b"a" * 6_000)
        await w.drain()
        await asyncio.sleep(0.2)
        w.write(b"a" * 6_000 + b"\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(r.read(), 20)
        w.close()
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


async def test_connections_above_the_cap_are_closed(db_url: str) -> None:
    async with guarded_server(db_url, max_connections=3, header_timeout=60.0) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        closed = await asyncio.gather(*(_closed_by_server(r, 20) for r, _ in extra))
        assert closed == [True, True, True]
        for _, w in [*held, *extra]:
            w.close()

        async def answers() -> bool:  # once the server has seen the closes
            try:
                await _healthz_answers(port)
            except (AssertionError, OSError, TimeoutError):
                return False
            return True

        await wait_until(answers, "a normal client answered after the extra connections closed")


async def test_long_polls_are_capped_per_token(db_url: str) -> None:
    async with running_server(db_url, max_waits=10, max_waits_per_token=2) as srv:
        c = srv.client
        ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
        ok(await c.post("/v1/policies", json={"subject": "team", "pool": "p"}), 201)
        req = ok(
            await c.post("/v1/requests", json={"subject": "team", "resources": {"gpu": 1}}), 201
        )
        url = f"/v1/requests/{req['id']}?wait=10"
        waits = [asyncio.create_task(c.get(url)) for _ in range(2)]
        await wait_until(lambda: srv.notifier.waiting >= 2, "two waits", within=10, step=0.02)
        r = await c.get(url)
        error(r, 429)
        assert r.headers["retry-after"] == "1"
        # Another token is not capped: its wait is admitted too (shutdown then answers all three
        # at once, rather than after the full 10 s wait).
        other = asyncio.create_task(c.get(url, headers={"authorization": "Bearer another-token"}))
        await wait_until(lambda: srv.notifier.waiting >= 3, "the other token's wait", within=10)
        srv.notifier.begin_shutdown()
        for t in [*waits, other]:
            ok(await t)


def test_nofile_limit_is_raised() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        expected = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        assert raise_nofile_limit() == max(low, expected)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_accept_errors_do_not_flood_the_log(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("respool.test.flood")
    logger.addFilter(RateLimitedLog(interval=3600))
    with caplog.at_level(logging.ERROR, logger="respool.test.flood"):
        for _ in range(1000):
            logger.error("socket.accept() out of system resource", exc_info=OSError(24, "x"))
        logger.error("something else")
    assert len(caplog.records) == 2


# --- 10. names never shadow ids --------------------------------------------------------------


async def test_pool_names_never_shadow_ids(server: Server) -> None:
    c = server.client
    error(await c.post("/v1/pools", json={"name": str(uuid.uuid4()), "capacity": {}}), 400, "name")
    first = ok(await c.post("/v1/pools", json={"name": "first", "capacity": {}}), 201)
    shadow = {"name": first["id"][:8], "capacity": {}}
    error(await c.post("/v1/pools", json=shadow), 409, "name")
    # A name that later became another pool's id prefix: the ref is ambiguous, listing both.
    ok(await c.post("/v1/pools", json={"name": "abcd", "capacity": {}}), 201)
    other = ok(await c.post("/v1/pools", json={"name": "other", "capacity": {}}), 201)
    new_id = uuid.UUID("abcd0000-0000-4000-8000-000000000001")
    await _sql(
        server.db_url,
        "UPDATE respool.pools SET id = $1 WHERE id = $2",
        new_id,
        uuid.UUID(other["id"]),
    )
    body = error(await c.get("/v1/pools/abcd"), 400)
    assert "abcd (" in body["detail"] and "other (" in body["detail"]
    error(await c.delete("/v1/pools/abcd"), 400)
    assert ok(await c.get("/v1/pools/first"))["id"] == first["id"]
    assert ok(await c.get(f"/v1/pools/{first['id'][:6]}"))["name"] == "first"


# --- 11. the admin token must be a real secret -----------------------------------------------


@pytest.mark.parametrize("value", ["a", "x" * 31, "change-me-to-a-long-random-string"])
def test_weak_admin_tokens_are_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="RESPOOL_ADMIN_TOKEN"):
        Settings.from_env({"RESPOOL_ADMIN_TOKEN": value})


def test_deploy_examples_hold_no_accepted_secret() -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    env = dict(
        line.split("=", 1)
        for line in (deploy / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    with pytest.raises(SettingsError, match="RESPOOL_ADMIN_TOKEN"):
        Settings.from_env({"RESPOOL_ADMIN_TOKEN": env["RESPOOL_ADMIN_TOKEN"]})
    assert Settings.from_env({"RESPOOL_ADMIN_TOKEN": "y" * 32}).admin_token == "y" * 32


# --- 12. strings are not numbers -------------------------------------------------------------


async def test_cpu_count_as_a_string_is_refused(server: Server) -> None:
    c = server.client
    ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"cpu": 8}}), 201)
    ok(await c.post("/v1/policies", json={"subject": "team", "pool": "p"}), 201)
    body = {"subject": "team", "pool": "p", "settings": {"cpu_count": "1"}}
    error(await c.post("/v1/requests", json=body), 400, "settings.cpu_count")
    body["settings"] = {"cpu_count": 1.5}
    ok(await c.post("/v1/requests", json=body), 201)


# --- 13. the embedded server is reachable by its owner only ----------------------------------


@pytest.mark.slow  # starts a PostgreSQL server of its own
def test_embedded_server_socket_is_private() -> None:
    from app.db.embedded import start_embedded_server

    # A data directory path too long for a unix socket: the wheel falls back to a runtime dir.
    base = Path(tempfile.mkdtemp(prefix="respool-test-pg-"))
    server = start_embedded_server(base / ("d" * 90) / "pgdata", cleanup_mode="delete")
    try:
        sock_dir = server.get_postmaster_info().socket_dir
        assert sock_dir is not None and sock_dir.stat().st_mode & 0o077 == 0, oct(
            sock_dir.stat().st_mode
        )
        socks = [p for p in sock_dir.glob(".s.PGSQL.*") if not p.name.endswith(".lock")]
        assert socks and all(p.stat().st_mode & 0o077 == 0 for p in socks)

        async def setting() -> str:
            conn = await asyncpg.connect(server.get_uri("postgres"))
            try:
                return str(
                    await conn.fetchval(
                        "SELECT setting FROM pg_file_settings "
                        "WHERE name = 'unix_socket_permissions'"
                    )
                )
            finally:
                await conn.close()

        assert asyncio.run(setting()) == "0700"
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)
