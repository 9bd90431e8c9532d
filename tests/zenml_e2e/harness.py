"""A respool server and a real ZenML server wired together, for the e2e test and the bench.

respool runs from this venv (``respool serve``); the ZenML server, its CLI and the pipelines run
in ZenML's own venv (``RESPOOL_ZENML_VENV``, default ``.venv-zenml`` at the repository root,
made by ``integrations/zenml/ci-install.sh``). Both servers listen on loopback only.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SIDE = Path(__file__).resolve().parent / "zenml_side"
ZENML_VENV = Path(os.environ.get("RESPOOL_ZENML_VENV", ROOT / ".venv-zenml"))
ZENML_PYTHON = ZENML_VENV / "bin" / "python"
PLUGIN = ROOT / "integrations" / "zenml" / "respool_zenml"
STORE_SOURCE = "respool_zenml.store.RespoolResourcePoolStore"
PASSWORD = "e2e-password"


def zenml_available() -> str | None:
    """Why the ZenML side cannot run here (None when it can)."""
    if not ZENML_PYTHON.exists():
        return f"no ZenML venv at {ZENML_VENV} (integrations/zenml/ci-install.sh makes it)"
    probe = subprocess.run(
        [str(ZENML_PYTHON), "-c", "import zenml, respool_zenml.store as s; print(s.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return f"the ZenML venv cannot import zenml and respool_zenml: {probe.stderr[-500:]}"
    # The venv holds a copy of the plug-in (pip install, not editable): it must be this one.
    installed = Path(probe.stdout.strip().splitlines()[-1]).parent
    for source in sorted(PLUGIN.glob("*.py")):
        copy = installed / source.name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            return (
                f"respool_zenml in {ZENML_VENV} is not {PLUGIN} ({source.name} differs):"
                " run integrations/zenml/ci-install.sh again"
            )
    return None


def _wait_http(url: str, proc: subprocess.Popen[bytes], seconds: float, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited ({proc.returncode}): {log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {seconds} s: {log.read_text()[-3000:]}")


@dataclass
class Servers:
    respool_url: str
    zenml_url: str
    workdir: Path
    client_env: dict[str, str]
    respool: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.respool = httpx.Client(base_url=self.respool_url, timeout=30)

    def rp(self, method: str, path: str, **kw: Any) -> Any:
        """One respool API call; asserts a 2xx answer."""
        resp = self.respool.request(method, path, **kw)
        assert resp.status_code < 300, resp.text
        return resp.json() if resp.content else None

    def requests_of_run(self, run: str) -> list[dict[str, Any]]:
        items = self.rp("GET", "/v1/requests", params={"limit": 1000})["items"]
        return [r for r in items if r["labels"].get("run") == run]

    def drive(self, *args: str, timeout: float = 600) -> dict[str, Any]:
        """``zenml_side/drive.py ARGS`` in ZenML's venv; its RESULT line, with the step log."""
        proc = self.start_drive(*args)
        out, _ = proc.communicate(timeout=timeout)
        return self.result(proc, out)

    def start_drive(self, *args: str) -> subprocess.Popen[str]:
        log = self.workdir / f"steps-{time.time_ns()}.jsonl"
        env = {**self.client_env, "ZT_STEP_LOG": str(log)}
        proc = subprocess.Popen(
            [str(ZENML_PYTHON), "drive.py", *args],
            cwd=SIDE,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        proc.step_log = log  # type: ignore[attr-defined]
        return proc

    @staticmethod
    def steps(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
        log: Path = proc.step_log  # type: ignore[attr-defined]
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line]

    def result(self, proc: subprocess.Popen[str], out: str) -> dict[str, Any]:
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert lines, f"drive.py printed no result (exit {proc.returncode}):\n{out[-5000:]}"
        result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
        result["step_log"] = self.steps(proc)
        result["output"] = out
        return result

    def zenml_cli(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [str(ZENML_VENV / "bin" / "zenml"), *args],
            cwd=SIDE,
            env={**self.client_env, "COLUMNS": "250"},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def running(db_url: str, workdir: Path, reconcile_interval: float = 0.2) -> Iterator[Servers]:
    """respool on ``db_url`` and a ZenML server (auth on, plug-in loaded) using it."""
    rp_port, zen_port = free_port(), free_port()
    respool_url = f"http://127.0.0.1:{rp_port}"
    zenml_url = f"http://127.0.0.1:{zen_port}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ZENML_", "RESPOOL_"))}
    base["ZENML_ANALYTICS_OPT_IN"] = "false"
    base["ZENML_LOGGING_VERBOSITY"] = "INFO"
    base["AUTO_OPEN_DASHBOARD"] = "false"
    rp_log, zen_log = workdir / "respool.log", workdir / "zenml-server.log"
    rp_env = {
        **base,
        "RESPOOL_DATABASE_URL": db_url,
        "RESPOOL_RECONCILE_INTERVAL": str(reconcile_interval),
    }
    respool_bin = Path(sys.executable).parent / "respool"
    with contextlib.ExitStack() as stack:
        rp = subprocess.Popen(
            [str(respool_bin), "serve", "--host", "127.0.0.1", "--port", str(rp_port)],
            env=rp_env,
            stdout=stack.enter_context(rp_log.open("wb")),
            stderr=subprocess.STDOUT,
        )
        stack.callback(_stop, rp)
        zen_env = {
            **base,
            "PATH": f"{ZENML_VENV / 'bin'}:{base.get('PATH', '')}",
            "ZENML_STORE_URL": f"sqlite:///{workdir / 'zenml.db'}",
            "ZENML_CONFIG_PATH": str(workdir / "server-config"),
            # OAuth2 password auth (ZenML's default for a server): step heartbeats reach the
            # store only from an authenticated step.
            "ZENML_SERVER_AUTH_SCHEME": "OAUTH2_PASSWORD_BEARER",
            "ZENML_SERVER_JWT_SECRET_KEY": os.urandom(32).hex(),
            "ZENML_SERVER_AUTO_ACTIVATE": "1",
            "ZENML_DEFAULT_USER_NAME": "default",
            "ZENML_DEFAULT_USER_PASSWORD": PASSWORD,
            "ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE": STORE_SOURCE,
            "RESPOOL_URL": respool_url,
        }
        zen = subprocess.Popen(
            [str(ZENML_PYTHON), "-m", "uvicorn", "zenml.zen_server.zen_server_api:app"]
            + ["--host", "127.0.0.1", "--port", str(zen_port)],
            env=zen_env,
            cwd=workdir,
            stdout=stack.enter_context(zen_log.open("wb")),
            stderr=subprocess.STDOUT,
        )
        stack.callback(_stop, zen)
        _wait_http(f"{respool_url}/readyz", rp, 120, rp_log)
        _wait_http(f"{zenml_url}/health", zen, 300, zen_log)
        client_env = {
            **base,
            "PATH": f"{ZENML_VENV / 'bin'}:{base.get('PATH', '')}",  # isolated steps run `python`
            "ZENML_STORE_URL": zenml_url,
            "ZENML_STORE_USERNAME": "default",
            "ZENML_STORE_PASSWORD": PASSWORD,
            "ZENML_CONFIG_PATH": str(workdir / "client-config"),
        }
        servers = Servers(respool_url, zenml_url, workdir, client_env)
        stack.callback(servers.respool.close)
        setup = subprocess.run(
            [str(ZENML_PYTHON), "drive.py", "setup"],
            cwd=SIDE,
            env={**client_env, "ZT_STEP_LOG": os.devnull},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert setup.returncode == 0, setup.stdout + setup.stderr
        yield servers
