"""docs/zenml.md runs as written: every block it marks with ``<!-- doc-test: … -->`` is run, in
the page's order, against a real respool server and a real ZenML server (ZenML's venv from
integrations/zenml/ci-install.sh).

The page's own text is what runs, so the page and this test cannot drift apart. The markers:

``install [zenml]``
    an install; not run (the test runs in the venvs CI made), but the ZenML one must be the
    install of ``integrations/zenml/ci-install.sh``, line for line.
``serve URL``
    a server, started in the background; the next block runs once URL answers 200.
``file NAME``
    a file the user saves as NAME (in the working directory).
``run NAME``
    commands, run with ``bash -eu -o pipefail``; they must succeed. What the page says they do
    is then checked through respool's API (:data:`CHECKS`).

Each block runs in a fresh shell, as in a terminal of its own, from a working directory that
stands for the root of a respool checkout (``.venv``, ``.venv-zenml``, ``client`` and
``integrations`` link to the real ones). The page's ports, 8080 (respool) and 8237 (ZenML), are
replaced with free ones; ``RESPOOL_URL`` points the ``respool`` command at respool's port as
the default would, and ``RESPOOL_DATABASE_URL`` gives respool the test's database.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.ports import free_port
from zenml_e2e.harness import ROOT, ZENML_VENV, zenml_available

DOC = ROOT / "docs" / "zenml.md"
CI_INSTALL = ROOT / "integrations" / "zenml" / "ci-install.sh"
MARKED = re.compile(
    r"^<!-- doc-test: (?P<kind>\w+)(?: (?P<arg>[^\n]*?))? -->\n"
    r"```(?P<lang>\w+)\n(?P<body>.*?)\n```$",
    re.MULTILINE | re.DOTALL,
)
PAGE_PORTS = {"respool": 8080, "zenml": 8237}


@dataclass(frozen=True)
class Block:
    kind: str
    arg: str
    lang: str
    body: str


def doc_blocks() -> list[Block]:
    text = DOC.read_text()
    return [
        Block(m["kind"], (m["arg"] or "").strip(), m["lang"], m["body"])
        for m in MARKED.finditer(text)
    ]


def test_the_marked_blocks_of_the_page_are_the_walkthrough() -> None:
    """What the doc runner relies on: every fenced command block of the walkthrough is marked,
    the markers are known, and the page's ZenML install is CI's (no ZenML needed)."""
    blocks = doc_blocks()
    kinds = [(b.kind, b.arg.split(" ")[0]) for b in blocks]
    assert {k for k, _ in kinds} <= {"install", "serve", "file", "run"}, kinds
    assert ("file", "two_trainings.py") in kinds and ("run", "two-trainings") in kinds
    assert ("run", "nodes") in kinds and ("run", "a100s") in kinds
    # Every fenced sh/python block of the page is marked: none is left out of the run.
    text = DOC.read_text()
    fences = re.findall(r"^```(sh|python)$", text, re.MULTILINE)
    assert len(fences) == len(blocks)
    for name in [b.arg for b in blocks if b.kind == "file"]:
        assert name.endswith(".py")
    # The ZenML install the page shows is the one CI runs.
    (install,) = [b for b in blocks if b.kind == "install" and b.arg == "zenml"]
    ci = {_normal_install(line) for line in CI_INSTALL.read_text().splitlines()}
    for line in install.body.splitlines():
        assert _normal_install(line) in ci, f"{line!r} is not in {CI_INSTALL.name}"


def _normal_install(line: str) -> str:
    """A venv or pip line of the page or of ci-install.sh, in one spelling."""
    line = (
        line.split(" #", 1)[0].replace("</dev/null", "").replace('"$VENV/bin/', ".venv-zenml/bin/")
    )
    line = line.replace('"$VENV"', ".venv-zenml").replace('pip" install', "pip install")
    return " ".join(word for word in line.split() if word != "-q")


# --- running the page ------------------------------------------------------------------------


class Page:
    """The page's blocks run one after the other, the servers among them kept running."""

    def __init__(self, workdir: Path, db_url: str) -> None:
        self.workdir = workdir
        self.ports = {name: free_port() for name in PAGE_PORTS}
        self.respool_url = f"http://127.0.0.1:{self.ports['respool']}"
        self.servers: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.outputs: dict[str, str] = {}
        for name, target in {
            ".venv": Path(sys.prefix),
            ".venv-zenml": ZENML_VENV,
            "client": ROOT / "client",
            "integrations": ROOT / "integrations",
        }.items():
            (workdir / name).symlink_to(target.resolve(), target_is_directory=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("ZENML_", "RESPOOL_"))}
        self.env = base | {
            "RESPOOL_DATABASE_URL": db_url,
            "RESPOOL_PORT": str(self.ports["respool"]),
            "RESPOOL_URL": self.respool_url,
            "ZENML_CONFIG_PATH": str(workdir / "zenml-config"),
            "ZENML_ANALYTICS_OPT_IN": "false",
            "AUTO_OPEN_DASHBOARD": "false",
            "COLUMNS": "200",
        }

    def text(self, body: str) -> str:
        for name, port in PAGE_PORTS.items():
            body = body.replace(f"127.0.0.1:{port}", f"127.0.0.1:{self.ports[name]}")
            body = body.replace(f"--port {port}", f"--port {self.ports[name]}")
        return body

    def serve(self, body: str, ready: str) -> None:
        log = self.workdir / f"server-{len(self.servers)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-eu", "-o", "pipefail", "-c", self.text(body)],
                cwd=self.workdir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole
            )
        self.servers.append((proc, log))
        url = self.text(ready)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{url}: the server exited:\n{log.read_text()[-4000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise AssertionError(f"{url} did not answer within 300 s:\n{log.read_text()[-4000:]}")

    def run(self, name: str, body: str) -> str:
        done = subprocess.run(
            ["bash", "-eu", "-o", "pipefail", "-c", self.text(body)],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"block {name!r} failed ({done.returncode}):\n{output[-6000:]}"
        self.outputs[name] = output
        return output

    def stop(self) -> None:
        for proc, _ in reversed(self.servers):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)

    def rp(self, path: str, **params: Any) -> Any:
        resp = httpx.get(self.respool_url + path, params=params, timeout=30)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def requests(self) -> list[dict[str, Any]]:
        """Every request of the page's subject, oldest first."""
        items = self.rp("/v1/requests", subject="orchestrator:default", limit=1000)["items"]
        return sorted(items, key=lambda r: r["created_at"])


def _check_two_trainings(page: Page, output: str) -> None:
    # Two steps asked for the pool's one GPU: the second waited for the first to release it.
    reqs = page.requests()
    assert len(reqs) == 2, reqs
    assert [r["status"] for r in reqs] == ["released", "released"]
    assert {r["labels"]["step"] for r in reqs} == {"train", "train_2"}
    first, second = sorted(reqs, key=lambda r: r["allocated_at"])
    assert second["allocated_at"] >= first["finished_at"]
    history = page.rp(f"/v1/requests/{second['id']}/events")
    assert [e["to"] for e in history] == ["queued", "allocated", "released"]
    # What the page shows of the run's output (ZenML's launcher).
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)  # ZenML's log colours
    said = "\n".join(line for line in plain.splitlines() if "esource request" in line)
    assert f"Waiting for resource request {second['id']} of step " in said, said
    for r in reqs:
        assert f"Resource request {r['id']} for step {r['labels']['step']} was approved" in said
    # `zenml resource-request list` shows them, read from respool.
    for r in reqs:
        assert r["id"] in output or r["id"][:8] in output


def _check_respool_side(page: Page, output: str) -> None:
    for r in page.requests():
        assert r["id"][:8] in output


def _check_nodes(page: Page, output: str) -> None:
    (pool,) = page.rp("/v1/pools")
    assert pool["name"] == "gpus" and pool["capacity"] == {"gpu": 12}
    (policy,) = page.rp("/v1/policies")
    assert policy["reserved"] == {"gpu": 8}


def _check_a100s(page: Page, output: str) -> None:
    new = page.requests()[2:]
    by_step = {r["labels"]["step"]: r for r in new}
    assert set(by_step) == {"train", "finetune"}, new
    assert by_step["train"]["node_selector"] == {"gpu-class": "a100"}
    assert by_step["train"]["resources"] == {"gpu": 2, "step_run": 1}
    assert by_step["finetune"]["node_selector"] == {"gpu-type": "A100-80G"}
    assert by_step["finetune"]["resources"] == {"gpu": 4, "step_run": 1}
    assert all((r["pool"], r["status"]) == ("gpus", "released") for r in new)


CHECKS: dict[str, Callable[[Page, str], None]] = {
    "two-trainings": _check_two_trainings,
    "respool-side": _check_respool_side,
    "nodes": _check_nodes,
    "a100s": _check_a100s,
}


@pytest.fixture
def page(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Page]:
    why = zenml_available()
    if why is not None:
        pytest.skip(why)
    p = Page(tmp_path, request.getfixturevalue("module_db_url"))
    try:
        yield p
    finally:
        p.stop()


@pytest.mark.zenml
@pytest.mark.timeout(2400)
def test_the_zenml_page_runs_as_written(page: Page) -> None:
    ran = []
    for block in doc_blocks():
        if block.kind == "install":
            continue  # the venvs this test runs in; the ZenML one is checked against CI's above
        if block.kind == "file":
            (page.workdir / block.arg).write_text(block.body + "\n")
        elif block.kind == "serve":
            page.serve(block.body, block.arg)
        else:
            output = page.run(block.arg, block.body)
            if block.arg in CHECKS:
                CHECKS[block.arg](page, output)
        ran.append(f"{block.kind} {block.arg}")
    assert set(CHECKS) <= {r.split(" ", 1)[1] for r in ran}, ran
