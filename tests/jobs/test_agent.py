"""``respool agent`` (docs/jobs.md) with real processes: two agents on this machine act as the
agents of two 8-GPU nodes of one pool, against a real server and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db import tokens
from support.db import direct
from support.http import ok
from support.server import Server, respool_command, running_server
from support.wait import first_true

ADMIN = "test-admin-token-agent-0123456789abcdef"

# A job: takes each of its GPUs with an exclusive file (a GPU held by two jobs at once fails the
# job with 99), writes what it saw, sleeps, gives the GPUs back, exits with the code asked for.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    out, code, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    node = os.environ.get("RESPOOL_NODE", "")
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    held = []
    for g in gpus:
        path = os.path.join(out, "held", node + "-" + g)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            sys.exit(99)
        held.append(path)
    print("hello from", os.environ["RESPOOL_REQUEST_ID"], flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    seen = {k: v for k, v in os.environ.items() if k.startswith(("RESPOOL_", "CUDA_", "JOB_"))}
    with open(os.path.join(out, "seen", os.environ["RESPOOL_REQUEST_ID"] + "-"
                           + os.environ["RESPOOL_ATTEMPT"]), "w") as f:
        json.dump({"env": seen, "pid": os.getpid(), "pgid": os.getpgid(0)}, f)
    time.sleep(pause)
    for path in held:
        os.unlink(path)
    sys.exit(code)
    """
)

# A job that records the signals it gets and waits for them.
WAITER = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    def on_term(signum, frame):
        with open(os.path.join(out, "term-" + os.environ["RESPOOL_REQUEST_ID"]), "w") as f:
            f.write(str(signum))
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(out, "started-" + os.environ["RESPOOL_REQUEST_ID"] + "-"
                           + os.environ["RESPOOL_ATTEMPT"]), "w") as f:
        f.write(os.environ.get("RESPOOL_NODE", ""))
    print("waiting", flush=True)
    while True:
        time.sleep(0.05)
    """
)


# A job that says when it starts (its pid) and when it gets SIGTERM (it then takes 1.5 s to clean
# up), and whether the process of an earlier attempt of it was still alive when it started.
ATTEMPT = textwrap.dedent(
    """
    import os, signal, sys, time
    out, rid = sys.argv[1], os.environ["RESPOOL_REQUEST_ID"]
    attempt = int(os.environ["RESPOOL_ATTEMPT"])
    def on_term(signum, frame):
        with open(os.path.join(out, f"term-{rid}-{attempt}"), "w") as f:
            f.write(str(signum))
        time.sleep(1.5)  # cleaning up
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    for earlier in range(1, attempt):
        path = os.path.join(out, f"pid-{rid}-{earlier}")
        try:
            os.kill(int(open(path).read()), 0)
        except (OSError, ValueError):
            continue
        open(os.path.join(out, f"overlap-{rid}"), "w").close()
    with open(os.path.join(out, f"pid-{rid}-{attempt}"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)
    """
)


@dataclass
class Cluster:
    server: Server
    tmp: Path
    admin: dict[str, str]
    client: dict[str, str]
    agent_tokens: dict[str, str]
    agents: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)

    @property
    def c(self) -> httpx.AsyncClient:
        return self.server.client

    async def start_agent(self, node: str) -> asyncio.subprocess.Process:
        env = {
            **os.environ,
            "RESPOOL_URL": self.server.url,
            "RESPOOL_TOKEN": self.agent_tokens[node],
        }
        with (self.tmp / f"agent-{node}.err").open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "respool_client.agent", "--node", node, "--interval", "1",
                env=env, stdout=asyncio.subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        self.agents[node] = proc
        return proc

    async def submit(self, argv: list[str], gpus: int = 4, **kw: Any) -> dict[str, Any]:
        job = {"command": argv, **kw.pop("job", {})}
        body = {"subject": kw.pop("subject", "team"), "pool": "p", "resources": {"gpu": gpus},
                "job": job, **kw}  # fmt: skip
        made: dict[str, Any] = ok(
            await self.c.post("/v1/requests", headers=self.client, json=body), 201
        )
        return made

    async def agent_ready(self, node: str) -> bool:
        doc = ok(await self.c.get(f"/v1/nodes/{node}", headers=self.admin))
        return bool(doc.get("agent") == "ready")

    async def get(self, rid: str) -> dict[str, Any]:
        doc: dict[str, Any] = ok(await self.c.get(f"/v1/requests/{rid}", headers=self.client))
        return doc

    async def logs(self, rid: str, attempt: int | None = None) -> dict[str, Any]:
        params = {} if attempt is None else {"attempt": attempt}
        doc: dict[str, Any] = ok(
            await self.c.get(f"/v1/requests/{rid}/logs", headers=self.client, params=params)
        )
        return doc

    async def until_done(self, rid: str, within: float = 60.0) -> dict[str, Any]:
        doc = await first_true(lambda: self._terminal(rid), within)
        assert isinstance(doc, dict)
        return doc

    async def _terminal(self, rid: str) -> dict[str, Any] | None:
        doc = await self.get(rid)
        return doc if doc["status"] in ("released", "cancelled", "expired", "preempted") else None


@pytest.fixture
async def cluster(db_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Pool p with two 8-GPU nodes n1, n2 (devices 0..7), a policy for team (and for boss, who
    owns the GPUs: reserved), a client token and an agent token per node; agents not started."""
    async with running_server(
        db_url, auth="on", admin_token=ADMIN, with_reconciler=True, reconcile_interval=0.2
    ) as srv:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        c = srv.client
        pool = {"name": "p", "preemption_grace_seconds": 20}
        ok(await c.post("/v1/pools", headers=admin, json=pool), 201)
        for node in ("n1", "n2"):
            body = {"name": node, "pool": "p", "devices": {"gpu": [str(i) for i in range(8)]}}
            ok(await c.post("/v1/nodes", headers=admin, json=body), 201)
        for subject, reserved in (("team", 0), ("boss", 16)):
            body = {"subject": subject, "pool": "p", "reserved": {"gpu": reserved}}
            ok(await c.post("/v1/policies", headers=admin, json=body), 201)
        async with direct(db_url) as conn:
            client, _ = await tokens.create_token(
                conn, name="team", role="client", subject_patterns=["team", "boss"]
            )
            agent_tokens = {}
            for node in ("n1", "n2"):
                agent_tokens[node], _ = await tokens.create_token(
                    conn, name=f"agent-{node}", role="agent", node=node
                )
        for sub in ("held", "seen"):
            (tmp_path / sub).mkdir()
        (tmp_path / "job.py").write_text(JOB)
        (tmp_path / "waiter.py").write_text(WAITER)
        cl = Cluster(srv, tmp_path, admin, {"Authorization": f"Bearer {client}"}, agent_tokens)
        try:
            yield cl
        finally:
            for proc in cl.agents.values():
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), 30)
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


def job(cl: Cluster, code: int = 0, pause: float = 0.3) -> list[str]:
    return [sys.executable, str(cl.tmp / "job.py"), str(cl.tmp), str(code), str(pause)]


def waiter(cl: Cluster) -> list[str]:
    return [sys.executable, str(cl.tmp / "waiter.py"), str(cl.tmp)]


@pytest.mark.slow
async def test_twenty_jobs_of_four_gpus_run_on_two_nodes_with_disjoint_gpus(
    cluster: Cluster,
) -> None:
    cl = cluster
    await cl.start_agent("n1")
    await cl.start_agent("n2")
    made = [await cl.submit(job(cl, code=i % 7, pause=0.5)) for i in range(20)]
    for i, m in enumerate(made):
        done = await cl.until_done(m["id"], within=120)
        # each exit code recorded (99 would say a GPU was held by two jobs at once)
        assert (done["status"], done["exit_code"]) == ("released", i % 7)
        logs = await cl.logs(m["id"])
        text = "".join(c["data"] for c in logs["chunks"] if c["stream"] == "stdout")
        assert f"hello from {m['id']}" in text and logs["done"]
    seen = [p.read_text() for p in (cl.tmp / "seen").iterdir()]
    assert len(seen) == 20


async def test_a_job_gets_the_grants_environment_and_its_output_and_exit_code_are_kept(
    cluster: Cluster,
) -> None:
    cl = cluster
    await cl.start_agent("n1")
    made = await cl.submit(
        job(cl, code=3), node_selector={"node": "n1"}, job={"env": {"JOB_SECRET": "v"}}
    )
    done = await cl.until_done(made["id"])
    assert (done["status"], done["exit_code"]) == ("released", 3)
    seen = (cl.tmp / "seen" / f"{made['id']}-1").read_text()

    env = json.loads(seen)["env"]
    assert env["RESPOOL_REQUEST_ID"] == made["id"] and env["RESPOOL_NODE"] == "n1"
    assert env["JOB_SECRET"] == "v" and len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 4
    assert "RESPOOL_TOKEN" not in env  # the agent's token stays with the agent
    logs = await cl.logs(made["id"])
    streams = {c["stream"]: c["data"] for c in logs["chunks"]}
    assert f"hello from {made['id']}" in "".join(
        c["data"] for c in logs["chunks"] if c["stream"] == "stdout"
    )
    assert "to stderr" in "".join(c["data"] for c in logs["chunks"] if c["stream"] == "stderr")
    assert streams


async def test_a_command_that_does_not_exist_fails_with_a_clear_message(cluster: Cluster) -> None:
    cl = cluster
    await cl.start_agent("n1")
    made = await cl.submit(["no-such-command-xyz", "--flag"], node_selector={"node": "n1"})
    done = await cl.until_done(made["id"])
    assert (done["status"], done["exit_code"]) == ("released", 127)
    text = "".join(c["data"] for c in (await cl.logs(made["id"]))["chunks"])
    assert "cannot run no-such-command-xyz" in text and "No such file or directory" in text


async def test_an_array_of_ten_sets_the_array_index(cluster: Cluster) -> None:
    cl = cluster
    await cl.start_agent("n1")
    await cl.start_agent("n2")
    members = [
        {"subject": "team", "pool": "p", "resources": {"gpu": 1}, "job": {"command": job(cl)}}
        for _ in range(10)
    ]
    made = ok(
        await cl.c.post(
            "/v1/requests/batch", headers=cl.client, json={"members": members, "array": True}
        ),
        201,
    )

    indexes = []
    for m in made["items"]:
        done = await cl.until_done(m["id"])
        assert done["exit_code"] == 0
        seen = json.loads((cl.tmp / "seen" / f"{m['id']}-1").read_text())
        indexes.append(int(seen["env"]["RESPOOL_ARRAY_INDEX"]))
    assert sorted(indexes) == list(range(10))


async def test_cancel_of_a_running_job_stops_its_group(cluster: Cluster) -> None:
    cl = cluster
    await cl.start_agent("n1")
    # a shell that started a child of its own (same group) and waits for it
    script = f"sleep 300 & echo $! > {cl.tmp}/child-$RESPOOL_REQUEST_ID; wait"
    made = await cl.submit(["sh", "-c", script], node_selector={"node": "n1"})
    child_file = cl.tmp / f"child-{made['id']}"
    waiting = await cl.submit(waiter(cl), node_selector={"node": "n1"})
    rid = waiting["id"]
    await first_true(lambda: (cl.tmp / f"started-{rid}-1").exists())
    await first_true(lambda: child_file.exists() and child_file.read_text().strip())
    child = int(child_file.read_text())
    loop = asyncio.get_running_loop()
    asked = loop.time()
    for one in (rid, made["id"]):
        ok(await cl.c.post(f"/v1/requests/{one}/cancel", headers=cl.client))
    await first_true(lambda: (cl.tmp / f"term-{rid}").exists(), within=20)
    print(f"SIGTERM {loop.time() - asked:.2f} s after the cancel")
    assert (cl.tmp / f"term-{rid}").read_text() == str(int(signal.SIGTERM))
    await first_true(lambda: not _alive(child), within=20)  # the child of the group too
    for one in (rid, made["id"]):
        done = await cl.until_done(one)
        assert done["status"] == "cancelled"


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


async def test_a_higher_priority_submission_preempts_a_running_job_with_sigterm(
    cluster: Cluster,
) -> None:
    cl = cluster
    await cl.start_agent("n1")
    # team borrows all of n1; boss owns the pool's GPUs (reserved) and asks for n1's 8
    first = await cl.submit(waiter(cl), gpus=8, node_selector={"node": "n1"})
    rid = first["id"]
    await first_true(lambda: (cl.tmp / f"started-{rid}-1").exists())
    loop = asyncio.get_running_loop()
    asked = loop.time()
    await cl.submit(["true"], gpus=8, subject="boss", node_selector={"node": "n1"})
    await first_true(lambda: (cl.tmp / f"term-{rid}").exists(), within=20)
    took = loop.time() - asked
    print(f"SIGTERM {took:.2f} s after the higher-priority submission")  # a figure, not a mark
    # A SIGTERM (not the SIGKILL that ends the pool's 20 s grace) proves the notice came at once.
    assert (cl.tmp / f"term-{rid}").read_text() == str(int(signal.SIGTERM))
    done = await cl.until_done(rid)
    assert done["status"] in ("preempted", "released")


async def _attempt_job_on_n1(cl: Cluster, **request: Any) -> tuple[asyncio.subprocess.Process, str]:
    """n1's agent, ready, running attempt 1 of an 8-GPU job of ATTEMPT (it records its pid and
    SIGTERM per attempt, and any overlap of two attempts); the agent's process and the job's id."""
    (cl.tmp / "attempt.py").write_text(ATTEMPT)
    agent = await cl.start_agent("n1")
    await first_true(lambda: cl.agent_ready("n1"))
    argv = [sys.executable, str(cl.tmp / "attempt.py"), str(cl.tmp)]
    rid = (await cl.submit(argv, gpus=8, **request))["id"]
    await first_true(lambda: (cl.tmp / f"pid-{rid}-1").exists())
    return agent, rid


@pytest.mark.slow
async def test_an_agent_killed_mid_job_its_job_runs_again_on_the_other_node(
    cluster: Cluster,
) -> None:
    cl = cluster
    a1, rid = await _attempt_job_on_n1(cl, max_retries=2, lease_seconds=8)
    assert (await cl.get(rid))["placement"]["node"] == "n1"
    first = int((cl.tmp / f"pid-{rid}-1").read_text())
    await cl.start_agent("n2")
    await first_true(lambda: cl.agent_ready("n2"))
    a1.kill()  # SIGKILL: its job's group dies with it (parent-death signal, guard)
    await a1.wait()
    await first_true(lambda: (cl.tmp / f"pid-{rid}-2").exists(), within=60)
    doc = await cl.get(rid)
    assert (doc["attempt"], doc["status"], doc["placement"]["node"]) == (2, "allocated", "n2")
    # never two copies at once: attempt 1's process was gone when attempt 2 started
    assert not (cl.tmp / f"overlap-{rid}").exists() and not _alive(first)
    ok(await cl.c.post(f"/v1/requests/{rid}/cancel", headers=cl.client))


async def test_a_stalled_agent_whose_lease_lapsed_stops_its_stale_run_before_the_next(
    cluster: Cluster,
) -> None:
    cl = cluster
    a1, rid = await _attempt_job_on_n1(
        cl, node_selector={"node": "n1"}, max_retries=1, lease_seconds=3
    )
    loop = asyncio.get_running_loop()
    a1.send_signal(signal.SIGSTOP)  # no heartbeat gets through: the lease lapses meanwhile
    try:
        await first_true(lambda: _attempt(cl, rid, 2), within=60)
    finally:
        a1.send_signal(signal.SIGCONT)
    resumed = loop.time()
    # the agent learns that attempt 1 is stale (its lease lapsed, the job requeued) and stops it
    await first_true(lambda: (cl.tmp / f"term-{rid}-1").exists(), within=30)
    stopped = loop.time() - resumed
    print(f"attempt 1 got SIGTERM {stopped:.2f} s after the agent resumed")
    assert (cl.tmp / f"term-{rid}-1").read_text() == str(int(signal.SIGTERM))
    # attempt 2 runs on n1 too, but only once attempt 1's process is gone
    await first_true(lambda: (cl.tmp / f"pid-{rid}-2").exists(), within=60)
    assert not (cl.tmp / f"overlap-{rid}").exists()
    doc = await cl.get(rid)
    assert (doc["attempt"], doc["status"], doc["job"]["claimed"]["attempt"]) == (2, "allocated", 2)
    events = ok(await cl.c.get(f"/v1/requests/{rid}/events", headers=cl.client))
    assert ("allocated", "queued", "expired") in [(e["from"], e["to"], e["reason"]) for e in events]
    ok(await cl.c.post(f"/v1/requests/{rid}/cancel", headers=cl.client))


async def _attempt(cl: Cluster, rid: str, attempt: int) -> bool:
    return bool((await cl.get(rid))["attempt"] >= attempt)


def _started(cl: Cluster, rid: str, attempt: int) -> str | None:
    path = cl.tmp / f"started-{rid}-{attempt}"
    return path.read_text() if path.exists() else None


async def respool(cl: Cluster, *args: str) -> tuple[int, str, str]:
    """The ``respool`` command as a user runs it (a real process)."""
    env = {
        **os.environ,
        "RESPOOL_URL": cl.server.url,
        "RESPOOL_TOKEN": cl.client["Authorization"][7:],
    }
    proc = await asyncio.create_subprocess_exec(
        *respool_command(), *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_jobs_and_logs_from_the_cli(cluster: Cluster) -> None:
    cl = cluster
    await cl.start_agent("n1")
    await cl.start_agent("n2")
    code, out, err = await respool(
        cl, "submit", "-s", "team", "--pool", "p", "--gpu", "2", "--name", "hello",
        "--env", "JOB_COLOR=blue", "--", *job(cl, code=3),
    )  # fmt: skip
    assert code == 0, err
    rid = out.strip()
    code, out, err = await respool(cl, "logs", rid, "-f")
    assert code == 0 and f"hello from {rid}" in out and "to stderr" in err
    done = await cl.until_done(rid)
    assert done["exit_code"] == 3 and done["job"]["env_keys"] == ["JOB_COLOR"]
    code, out, err = await respool(cl, "jobs", "--all")
    row = next((line for line in out.splitlines() if rid[:8] in line), out)
    assert row.split()[:4] == [rid[:8], "hello", "team", "released"], out
    assert row.split()[-1] == "3", out
    assert all(len(line) <= 80 for line in out.splitlines())
    code, out, err = await respool(cl, "jobs")  # live ones only: it has ended
    assert rid[:8] not in out

    # gpuctl's job file
    (cl.tmp / "job.yaml").write_text(
        "kind: job\nversion: v0.1\nname: from-file\n"
        "resources:\n  pool: p\n  gpu: 1\n"
        f"command: {json.dumps(job(cl, code=5))}\n"
        "env:\n  JOB_FROM: file\n"
    )
    code, out, err = await respool(
        cl, "submit", "-s", "team", "-f", str(cl.tmp / "job.yaml"), "--wait"
    )
    assert code == 5, err
    rid = out.strip()
    seen = json.loads((cl.tmp / "seen" / f"{rid}-1").read_text())
    assert seen["env"]["JOB_FROM"] == "file" and seen["env"]["CUDA_VISIBLE_DEVICES"]
    assert (await cl.get(rid))["job"]["name"] == "from-file"

    code, out, err = await respool(
        cl, "submit", "-s", "team", "--gpu", "1", "--array", "3", "--", *job(cl)
    )
    assert code == 0, err
    ids = out.split()
    assert len(ids) == 3
    for i, one in enumerate(ids):
        assert (await cl.get(one))["job"]["array_index"] == i
