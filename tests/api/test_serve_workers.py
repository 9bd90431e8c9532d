"""``respool serve --workers 2`` as a real process (docs/ops.md, "Workers"): two API processes
on one port serve creates and long-polls, each with its own LISTEN connection, one reconciler
between them; a release wakes the waiters of both; SIGTERM answers every open long-poll and
ends them all with status 0."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest

from app.api.server import WORKER_MIN_UPTIME
from support.http import ok
from support.server import ServeProcess

pytestmark = pytest.mark.slow  # a real multi-process server: tens of seconds


def workers_of(parent: int) -> list[psutil.Process]:
    """The live worker processes of ``respool serve`` (multiprocessing's spawned children)."""
    found = []
    for p in psutil.Process(parent).children():
        try:
            if any("spawn_main" in part for part in p.cmdline()):
                found.append(p)
        except psutil.Error:  # ended (or a zombie not reaped yet)
            continue
    return found


def held_by(pid: int, port: int) -> int:
    """Established client connections on ``port`` that process ``pid`` holds."""
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


class Client:
    """One keep-alive HTTP/1.1 connection, raw (it stays with the worker that accepted it)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, method: str, path: str, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(data)}\r\n"
        if data:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + data)

    async def answer(self, within: float = 60) -> tuple[int, Any]:
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), within)
        lines = raw.decode("latin-1").split("\r\n")
        length = next(
            int(v)
            for n, _, v in (x.partition(":") for x in lines[1:])
            if n.lower() == "content-length"
        )
        body = await asyncio.wait_for(self.reader.readexactly(length), within)
        return int(lines[0].split()[1]), json.loads(body)

    def close(self) -> None:
        self.writer.close()


async def waiters_on_both(
    serve: ServeProcess, workers: list[psutil.Process], pool: str, limit: int = 300
) -> list[tuple[Client, str]]:
    """Open connections, each creating a request in ``pool`` (which waits) and long-polling
    it, until both workers hold at least two of them."""
    port = serve.port
    opened: list[tuple[Client, str]] = []
    while len(opened) < limit:
        batch = [await Client.open(port) for _ in range(10)]
        for c in batch:
            c.send(
                "POST", "/v1/requests", {"subject": "team", "pool": pool, "resources": {"gpu": 1}}
            )
        for c in batch:
            status, doc = await c.answer()
            assert status == 201, doc
            assert doc["status"] == "queued", doc
            c.send("GET", f"/v1/requests/{doc['id']}?wait=120&version={doc['version']}")
            opened.append((c, doc["id"]))
        await asyncio.sleep(0.2)
        if all(held_by(w.pid, port) >= 2 for w in workers):
            return opened
    raise AssertionError(f"{limit} connections did not reach both workers")


async def app_connections(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'respool-%'"
            " GROUP BY 1"
        )
    finally:
        await conn.close()
    return {r[0]: int(r[1]) for r in rows}


async def test_two_workers_share_the_port_and_stop_together(db_url: str, tmp_path: Path) -> None:
    serve = ServeProcess(db_url, tmp_path, reconciler=True, RESPOOL_WORKERS="2")
    serve.start()
    opened: list[tuple[Client, str]] = []
    try:
        await serve.ready()
        workers = workers_of(serve.pid)
        assert len(workers) == 2, [p.cmdline() for p in psutil.Process(serve.pid).children()]
        # Each worker listens to notifications on a connection of its own; one reconciler.
        for _ in range(100):
            apps = await app_connections(db_url)
            if apps.get("respool-listener") == 2 and apps.get("respool-reconciler") == 1:
                break
            await asyncio.sleep(0.1)
        assert apps.get("respool-listener") == 2, apps
        assert apps.get("respool-reconciler") == 1, apps

        async with httpx.AsyncClient(base_url=serve.url, timeout=30) as client:
            for name in ("p", "q"):
                ok(
                    await client.post("/v1/pools", json={"name": name, "capacity": {"gpu": 400}}),
                    201,
                )
                ok(await client.post("/v1/policies", json={"subject": "team", "pool": name}), 201)
            holders = {
                name: ok(
                    await client.post(
                        "/v1/requests",
                        json={"subject": "team", "pool": name, "resources": {"gpu": 400}},
                    ),
                    201,
                )
                for name in ("p", "q")
            }
            assert all(h["status"] == "allocated" for h in holders.values())

            # Creates and long-polls served by both workers; a release (committed by whichever
            # worker) wakes the waiters of both.
            opened = await waiters_on_both(serve, workers, "p")
            ok(await client.post(f"/v1/requests/{holders['p']['id']}/release"))
            for c, rid in opened:
                status, doc = await c.answer()
                assert (status, doc["id"], doc["status"]) == (200, rid, "allocated")
                c.close()

            # Waits open on both workers at SIGTERM are answered at once; everyone exits 0.
            opened = await waiters_on_both(serve, workers, "q")
        serve.send(signal.SIGTERM)
        for c, rid in opened:
            status, doc = await c.answer(within=20)
            assert (status, doc["id"], doc["status"]) == (200, rid, "queued")
        assert await serve.wait_exit(40) == 0, serve.log()
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        assert "Traceback" not in serve.log(), serve.log()
    finally:
        for c, _ in opened:
            c.close()
        serve.close()


async def test_a_worker_that_dies_is_restarted(db_url: str, tmp_path: Path) -> None:
    serve = ServeProcess(db_url, tmp_path, reconciler=False, RESPOOL_WORKERS="2")
    serve.start()
    try:
        await serve.ready()
        first = workers_of(serve.pid)
        assert len(first) == 2
        # Past the start-up window: a worker ending now is restarted, not fatal.
        await asyncio.sleep(WORKER_MIN_UPTIME + 1)
        first[0].kill()
        for _ in range(300):
            now = workers_of(serve.pid)
            if len(now) == 2 and first[0].pid not in {w.pid for w in now}:
                break
            await asyncio.sleep(0.1)
        assert {w.pid for w in now} - {first[0].pid, first[1].pid}, "no new worker"
        assert first[1].pid in {w.pid for w in now}
        async with httpx.AsyncClient(base_url=serve.url, timeout=30) as client:
            for _ in range(20):  # on whichever worker accepts
                ok(await client.get("/healthz"))
        assert "restarting it" in serve.log()
        serve.send(signal.SIGTERM)
        assert await serve.wait_exit(40) == 0, serve.log()
    finally:
        serve.close()
