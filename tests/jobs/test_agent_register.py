"""``respool agent --node NAME --register [--detect]`` (docs/jobs.md, "Registering the node"):
the agent makes sure its node exists before it serves, with what a fake ``nvidia-smi`` on PATH
says, as ``respool node register --detect`` does; an agent token registers or updates only the
node it is bound to. Real ``respool agent`` processes, tokens made by ``respool token create``
(CliRunner), a real server and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.cli import Cli
from support.http import ok
from support.nvidia import A100_LIST, A100_QUERY, fake_smi, gpus
from support.proc import stop
from support.server import Server, respool_command, running_server
from support.wait import first_true

ADMIN = "test-admin-token-register-0123456789ab"
EIGHT = [str(i) for i in range(8)]


@dataclass
class Box:
    server: Server
    cli: Cli
    smi: Path  # the fake nvidia-smi's directory, first on the agents' PATH
    tmp: Path
    admin: dict[str, str]

    @property
    def c(self) -> httpx.AsyncClient:
        return self.server.client

    async def token(self, name: str, *args: str) -> str:
        """``respool token create --role agent ARGS``: the token's text."""
        made = await self.cli.db("token", "create", "--role", "agent", "--name", name, *args,
                                 "-o", "json")  # fmt: skip
        assert made.exit_code == 0, made.stderr
        text: str = json.loads(made.stdout)["token"]
        return text

    def env(self, token: str) -> dict[str, str]:
        path = os.pathsep.join([str(self.smi), str(Path(sys.executable).parent), "/usr/bin:/bin"])
        return {**os.environ, "PATH": path, "RESPOOL_URL": self.server.url, "RESPOOL_TOKEN": token}

    async def start(self, token: str, *args: str) -> asyncio.subprocess.Process:
        err = (self.tmp / "agent.err").open("wb")
        try:
            return await asyncio.create_subprocess_exec(
                *respool_command(), "agent", *args, "--interval", "1", env=self.env(token),
                stdout=asyncio.subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        finally:
            err.close()

    async def agent_exits(self, token: str, *args: str) -> tuple[int, str]:
        """An agent that must exit on its own: (exit status, stderr)."""
        proc = await asyncio.create_subprocess_exec(
            *respool_command(), "agent", *args, env=self.env(token),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert out == b""
        assert proc.returncode is not None
        return proc.returncode, err.decode()

    async def node(self, name: str) -> dict[str, Any] | None:
        r = await self.c.get(f"/v1/nodes/{name}", headers=self.admin)
        if r.status_code == 404:
            return None
        doc: dict[str, Any] = ok(r)
        return doc


@pytest.fixture
async def box(db_url: str, tmp_path: Path) -> AsyncIterator[Box]:
    """Pool box (no capacity: its nodes give it) with a policy for team, auth on."""
    async with running_server(
        db_url, auth="on", admin_token=ADMIN, with_reconciler=True, reconcile_interval=0.2
    ) as srv:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        ok(await srv.client.post("/v1/pools", headers=admin, json={"name": "box"}), 201)
        body = {"subject": "team", "pool": "box"}
        ok(await srv.client.post("/v1/policies", headers=admin, json=body), 201)
        smi = tmp_path / "smi"
        smi.mkdir()
        yield Box(srv, Cli(url=srv.url, db_url=db_url), smi, tmp_path, admin)


def _os_units() -> tuple[int, int]:
    cpus = len(os.sched_getaffinity(0))
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return cpus * 1000, kib * 1024 // 1_000_000


async def test_register_detect_creates_the_node_then_runs_its_jobs(box: Box) -> None:
    fake_smi(box.smi, A100_QUERY, A100_LIST)
    token = await box.token("agent-gpu-1", "--node", "gpu-1", "--pool", "box")
    assert await box.node("gpu-1") is None  # a token for a node not registered yet
    agent = await box.start(token, "--node", "gpu-1", "--register", "--detect")
    try:
        node = await first_true(lambda: box.node("gpu-1"))
        mcpu, memory_mb = _os_units()
        assert node["pool"] == "box"
        assert node["capacity"] == {"gpu": 8, "mcpu": mcpu, "memory_mb": memory_mb}
        assert node["devices"] == {"gpu": EIGHT}
        assert node["labels"] == {"gpu-type": "A100-SXM4-80GB"}
        assert await first_true(lambda: _agent_ready(box, "gpu-1"))
        # the node serves: a job submitted to the pool runs there, on the GPUs it was granted
        argv = [
            sys.executable,
            "-c",
            "import os; print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])",
        ]
        job = {"subject": "team", "pool": "box", "resources": {"gpu": 4}, "job": {"command": argv}}
        rid = ok(await box.c.post("/v1/requests", headers=box.admin, json=job), 201)["id"]
        done = await first_true(lambda: _ended(box, rid))
        assert (done["status"], done["exit_code"]) == ("released", 0), done
        logs = ok(await box.c.get(f"/v1/requests/{rid}/logs", headers=box.admin))
        out = "".join(c["data"] for c in logs["chunks"] if c["stream"] == "stdout")
        assert out == "gpus 0,1,2,3\n"
    finally:
        assert await stop(agent) == 0
    said = (box.tmp / "agent.err").read_text()
    assert f"registered node gpu-1 in pool box: gpu 8, mcpu {mcpu}" in said, said

    # the box comes back with 4 GPUs: the same command updates the node, then serves
    fake_smi(box.smi, *gpus(4))
    again = await box.start(token, "--node", "gpu-1", "--register", "--detect")
    try:
        shrunk = await first_true(lambda: _gpus_are(box, "gpu-1", 4))
        assert shrunk["devices"] == {"gpu": ["0", "1", "2", "3"]}
    finally:
        assert await stop(again) == 0
    assert "updated node gpu-1 in pool box: gpu 4" in (box.tmp / "agent.err").read_text()


async def _agent_ready(box: Box, name: str) -> bool:
    node = await box.node(name)
    return node is not None and node["agent"] == "ready"


async def _ended(box: Box, rid: str) -> dict[str, Any] | None:
    doc: dict[str, Any] = ok(await box.c.get(f"/v1/requests/{rid}", headers=box.admin))
    return doc if doc["status"] in ("released", "cancelled", "expired") else None


async def _gpus_are(box: Box, name: str, n: int) -> dict[str, Any] | None:
    node = await box.node(name)
    return node if node is not None and node["capacity"].get("gpu") == n else None


async def test_a_token_for_node_a_cannot_register_or_update_node_b(box: Box) -> None:
    fake_smi(box.smi, A100_QUERY, A100_LIST)
    token_a = await box.token("agent-a", "--node", "node-a", "--pool", "box")
    # node-b is not registered: the agent of node-a may not create it
    code, err = await box.agent_exits(token_a, "--node", "node-b", "--register", "--detect")
    assert code == 2 and err.count("\n") == 1, err
    assert (
        "bound to node node-a: an agent may register or update only its own node, not node-b" in err
    )
    assert "HTTP 403" in err and await box.node("node-b") is None
    # node-b exists: it may not update it either, nor did it change
    made = {"name": "node-b", "pool": "box", "capacity": {"gpu": 2}}
    ok(await box.c.post("/v1/nodes", headers=box.admin, json=made), 201)
    code, err = await box.agent_exits(token_a, "--node", "node-b", "--register", "--detect")
    assert code == 2 and "not node-b" in err and "HTTP 403" in err, err
    assert (await box.node("node-b") or {})["capacity"] == {"gpu": 2}

    # over HTTP: only its own node, only its units, devices and labels, only in its pool
    a = {"Authorization": f"Bearer {token_a}"}
    c = box.c
    refused = [
        (await c.post("/v1/nodes", headers=a, json={"name": "node-b", "capacity": {"gpu": 1}}),
         "not node-b"),
        (await c.patch("/v1/nodes/node-b", headers=a, json={"capacity": {"gpu": 8}}), "not node-b"),
        (await c.get("/v1/nodes/node-b", headers=a), "not node-b"),
        (await c.get("/v1/nodes", headers=a), "role agent"),
        (await c.post("/v1/nodes", headers=a,
                      json={"name": "node-a", "pool": "other", "capacity": {"gpu": 1}}),
         "in pool box only, not in pool other"),
        (await c.post("/v1/nodes", headers=a,
                      json={"name": "node-a", "capacity": {"gpu": 1}, "state": "cordoned"}),
         "state is an admin's"),
    ]  # fmt: skip
    for r, why in refused:
        assert r.status_code == 403 and why in r.json()["detail"], (r.request.url, r.text)
    # its own node: created in its token's pool when the body names none
    mine = ok(
        await c.post("/v1/nodes", headers=a, json={"name": "node-a", "capacity": {"gpu": 1}}), 201
    )
    assert mine["pool"] == "box"
    assert ok(await c.get("/v1/nodes/node-a", headers=a))["name"] == "node-a"
    ok(await c.patch("/v1/nodes/node-a", headers=a, json={"labels": {"zone": "eu-1"}}))
    for r, why in [
        (await c.patch("/v1/nodes/node-a", headers=a, json={"pool": None}), "not in no pool"),
        (await c.patch("/v1/nodes/node-a", headers=a, json={"state": "active"}), "state"),
        (await c.patch("/v1/nodes/node-a?force=true", headers=a, json={}), "force"),
        (await c.post("/v1/nodes/node-a/cordon", headers=a), "role agent"),
        (await c.delete("/v1/nodes/node-a", headers=a), "role agent"),
    ]:
        assert r.status_code == 403 and why in r.json()["detail"], (r.request.url, r.text)
    assert (await box.node("node-a") or {})["state"] == "active"


async def test_a_pool_agent_and_a_token_without_a_pool_register_nothing(box: Box) -> None:
    ok(await box.c.post("/v1/pools", headers=box.admin,
                        json={"name": "cpu", "capacity": {"mcpu": 4000}}), 201)  # fmt: skip
    pool_agent = {"Authorization": f"Bearer {await box.token('agent-cpu', '--pool', 'cpu')}"}
    r = await box.c.post("/v1/nodes", headers=pool_agent, json={"name": "x", "capacity": {"a": 1}})
    assert r.status_code == 403 and "role agent" in r.json()["detail"]
    # a node in no pool: its token names no pool, so its agent may update it but not re-create it
    ok(await box.c.post("/v1/nodes", headers=box.admin,
                        json={"name": "loose", "capacity": {"gpu": 1}}), 201)  # fmt: skip
    loose = {"Authorization": f"Bearer {await box.token('agent-loose', '--node', 'loose')}"}
    ok(await box.c.patch("/v1/nodes/loose", headers=loose, json={"capacity": {"gpu": 2}}))
    ok(await box.c.delete("/v1/nodes/loose", headers=box.admin), 204)
    r = await box.c.post("/v1/nodes", headers=loose, json={"name": "loose", "capacity": {"gpu": 1}})
    assert r.status_code == 403 and "names no pool to register node loose in" in r.json()["detail"]


async def test_without_register_a_missing_node_is_one_clear_line(box: Box) -> None:
    token = await box.token("agent-new", "--node", "gpu-new", "--pool", "box")
    code, err = await box.agent_exits(token, "--node", "gpu-new")
    assert code == 69 and err.count("\n") == 1, err  # EX_UNAVAILABLE, as for any API refusal
    assert err.startswith("respool agent: error: node gpu-new is not registered: start its agent"
                          " with --register (and --detect)"), err  # fmt: skip
    # --register alone has nothing to register a missing node with
    code, err = await box.agent_exits(token, "--node", "gpu-new", "--register")
    assert code == 2 and err.count("\n") == 1, err
    assert "node gpu-new is not registered, and --register has nothing to register it with: add" \
        " --detect" in err  # fmt: skip
    code, err = await box.agent_exits(token, "--node", "gpu-new", "--detect")
    assert code == 2 and "--detect goes with --register" in err
    assert await box.node("gpu-new") is None


async def test_token_create_for_a_node_not_registered_needs_its_pool(box: Box) -> None:
    made = await box.cli.db("token", "create", "--role", "agent", "--node", "gpu-9")
    assert made.exit_code != 0
    assert made.stderr == (
        "error: --pool: must name where the agent registers node gpu-9, which is not registered"
        " yet\n"
    )
    body = {"name": "gpu-8", "pool": "box", "capacity": {"gpu": 1}}
    ok(await box.c.post("/v1/nodes", headers=box.admin, json=body), 201)
    ok(await box.c.post("/v1/pools", headers=box.admin, json={"name": "other"}), 201)
    made = await box.cli.db(
        "token", "create", "--role", "agent", "--node", "gpu-8", "--pool", "other"
    )
    assert made.exit_code != 0
    assert made.stderr == "error: --node: gpu-8 is in pool box, not in pool other\n"
