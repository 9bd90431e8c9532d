"""A step's preemption group (docs/preemption.md): ``preemption_group=`` on the client's
``create_request``, ``allocate`` (sync and async) and ``@allocated``, and ``respool run
--group G``, travel in the create body; the server keeps it on the request.

The body tests record what reaches an HTTP endpoint that answers every call with a 400 (the
recorder below); the end-to-end tests read the request back from a real server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from respool_client import AsyncRespool, Respool, allocated
from respool_client.errors import ApiError

from support.http import ok, pool_with_policy
from support.server import Server

EXIT_API = 69


class _Recorder(ThreadingHTTPServer):
    bodies: list[dict[str, Any]]


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("content-length") or 0)
        self.server.bodies.append(json.loads(self.rfile.read(length) or b"{}"))
        answer = json.dumps({"status_code": 400, "detail": "recorded", "field": None}).encode()
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _recorder() -> Iterator[_Recorder]:
    """An HTTP server on 127.0.0.1 recording each POST body (``.bodies``)."""
    srv = _Recorder(("127.0.0.1", 0), _Handler)
    srv.bodies = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _url(srv: _Recorder) -> str:
    host, port = srv.server_address[:2]
    return f"http://{host!s}:{port}"


async def test_async_create_and_allocate_send_the_group() -> None:
    with _recorder() as rec:
        async with AsyncRespool(_url(rec), retry_for=0) as rp:
            with pytest.raises(ApiError, match="recorded"):
                await rp.create_request("team", resources={"gpu": 1}, preemption_group="run-42")
            with pytest.raises(ApiError, match="recorded"):
                async with rp.allocate("team", resources={"gpu": 1}, preemption_group="run-42"):
                    pass
            with pytest.raises(ApiError, match="recorded"):
                await rp.create_request("team", resources={"gpu": 1})
    assert [b.get("preemption_group") for b in rec.bodies] == ["run-42", "run-42", None]


async def test_sync_allocate_and_the_decorator_send_the_group() -> None:
    with _recorder() as rec:
        url = _url(rec)

        def sync_step() -> None:
            with Respool(url, retry_for=0) as rp, rp.allocate("team", preemption_group="run-7"):
                pass

        @allocated(subject="team", url=url, preemption_group="run-8")
        def decorated() -> None:
            pass

        @allocated(subject="team", url=url, preemption_group="run-9")
        async def decorated_async() -> None:
            pass

        for call in (sync_step, decorated):
            with pytest.raises(ApiError, match="recorded"):
                await asyncio.to_thread(call)
        with pytest.raises(ApiError, match="recorded"):
            await decorated_async()
    assert [b["preemption_group"] for b in rec.bodies] == ["run-7", "run-8", "run-9"]


async def _run_wrapper(url: str, *options: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "respool_client.run", "--url", url, "-s", "team", *options,
        "--", sys.executable, "-c", "pass",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    return await proc.wait(), err.decode()


async def test_run_group_is_sent_and_a_bad_one_is_a_usage_error() -> None:
    with _recorder() as rec:
        code, err = await _run_wrapper(_url(rec), "--gpu", "1", "--group", "run-42")
        assert code == EXIT_API, err
        assert rec.bodies[-1]["preemption_group"] == "run-42"
        sent = len(rec.bodies)
        code, err = await _run_wrapper(_url(rec), "--gpu", "1", "--group", "a" * 129)
    assert code == 2 and "--group" in err
    assert len(rec.bodies) == sent  # refused before any call


@pytest.fixture
async def gpus(server: Server) -> AsyncIterator[Server]:
    await pool_with_policy(server.client, capacity={"gpu": 8})
    yield server


async def _group_of(server: Server, request_id: object) -> object:
    return ok(await server.client.get(f"/v1/requests/{request_id}"))["preemption_group"]


async def test_the_server_keeps_the_group_of_client_requests(gpus: Server) -> None:
    async with AsyncRespool(gpus.url) as rp:
        made = await rp.create_request("team", resources={"gpu": 1}, preemption_group="run-42")
        async with rp.allocate("team", resources={"gpu": 1}, preemption_group="run-42") as g:
            held = g.request_id
        plain = await rp.create_request("team", resources={"gpu": 1})
    assert made.preemption_group == "run-42"
    assert await _group_of(gpus, held) == "run-42"
    assert plain.preemption_group is None and await _group_of(gpus, plain.id) is None


async def test_run_group_is_kept_on_the_request(gpus: Server) -> None:
    code, err = await _run_wrapper(gpus.url, "--gpu", "1", "--group", "run-42")
    assert code == 0, err
    items = ok(await gpus.client.get("/v1/requests", params={"subject": "team"}))["items"]
    assert [(r["status"], r["preemption_group"]) for r in items] == [("released", "run-42")]
