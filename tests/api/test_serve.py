"""``respool serve`` as a real process: migrates, serves, and exits promptly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from tests.api.helpers import ok


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_migrates_serves_and_stops_on_sigterm(empty_db_url: str) -> None:
    port = _free_port()
    env = {**os.environ, "RESPOOL_DATABASE_URL": empty_db_url, "RESPOOL_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--no-reconciler"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[0].decode()
            try:
                r = httpx.get(f"{url}/readyz", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)
        assert ok(r)["schema_current"] is True  # serve migrated the empty database
        ok(httpx.post(f"{url}/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)

        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        out, _ = proc.communicate(timeout=10)
        assert time.monotonic() - start < 5
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert proc.returncode in (0, -signal.SIGTERM), out.decode()
        assert b"Traceback" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_bad_setting_is_one_line() -> None:
    env = {**os.environ, "RESPOOL_PORT": "nope"}
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve"], env=env, capture_output=True, timeout=60
    )
    assert r.returncode == 1
    assert r.stderr.decode().strip() == "error: RESPOOL_PORT: expected an integer, got 'nope'"
