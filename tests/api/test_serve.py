"""``respool serve`` as a real process: migrates, serves, and exits promptly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from support.http import ok
from support.server import ServeProcess, respool_command

pytestmark = pytest.mark.slow  # measured: tens of seconds (pytest --durations)


async def test_serve_migrates_serves_and_stops_on_sigterm(
    empty_db_url: str, tmp_path: Path
) -> None:
    serve = ServeProcess(empty_db_url, tmp_path, reconciler=False)
    serve.start()
    try:
        await serve.ready()
        async with httpx.AsyncClient(base_url=serve.url) as client:
            # serve migrated the empty database
            assert ok(await client.get("/readyz"))["schema_current"] is True
            ok(await client.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
        serve.send(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert await serve.wait_exit(10) in (0, -signal.SIGTERM), serve.log()
        assert "Traceback" not in serve.log()
    finally:
        serve.close()


def test_serve_bad_setting_is_one_line() -> None:
    env = {**os.environ, "RESPOOL_PORT": "nope"}
    r = subprocess.run(
        [*respool_command(), "serve"], env=env, capture_output=True, timeout=60, check=False
    )
    assert r.returncode == 1
    assert r.stderr.decode().strip() == "error: RESPOOL_PORT: expected an integer, got 'nope'"
