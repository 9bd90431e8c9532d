"""Jobs and node agents over HTTP (docs/jobs.md): a request may carry a job; the agent of the
node it is placed on claims each attempt once, sends its output and releases it with the exit
code; an agent token reaches only its node's jobs; env values never leave the claim answer; a
lost agent's node takes no new jobs and its unclaimed jobs go back to the queue; a job whose
lease lapses runs again while it has retries."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest

from app.db import tokens
from support.cli import Cli, failed
from support.db import direct, reconcile
from support.http import error, ok
from support.server import Server, running_server, waiting_clients

ADMIN_TOKEN = "test-admin-token-jobs-0123456789abcdef"
SECRET = "s3cr3t-value-never-shown"
LOG_LIMIT = 2048


@dataclass
class Setup:
    server: Server
    admin: dict[str, str]
    client: dict[str, str]
    agent1: dict[str, str]  # the agent of node n1
    agent2: dict[str, str]  # the agent of node n2

    @property
    def c(self) -> httpx.AsyncClient:
        return self.server.client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def jobs(db_url: str) -> AsyncIterator[Setup]:
    """Pool p of two 4-GPU nodes n1 and n2 (pack), a policy of team, a client token for team,
    and an agent token bound to each node."""
    async with running_server(
        db_url, auth="on", admin_token=ADMIN_TOKEN, log_limit=LOG_LIMIT
    ) as srv:
        admin = bearer(ADMIN_TOKEN)
        c = srv.client
        ok(await c.post("/v1/pools", headers=admin, json={"name": "p"}), 201)
        ok(await c.post("/v1/policies", headers=admin, json={"subject": "team", "pool": "p"}), 201)
        for node in ("n1", "n2"):
            body = {"name": node, "pool": "p", "capacity": {"gpu": 4}}
            ok(await c.post("/v1/nodes", headers=admin, json=body), 201)
        async with direct(db_url) as conn:
            client, _ = await tokens.create_token(
                conn, name="team-ci", role="client", subject_patterns=["team"]
            )
            a1, t1 = await tokens.create_token(conn, name="agent-n1", role="agent", node="n1")
            a2, _ = await tokens.create_token(conn, name="agent-n2", role="agent", node="n2")
        assert (t1.role, t1.node) == ("agent", "n1")
        yield Setup(srv, admin, bearer(client), bearer(a1), bearer(a2))


def job_body(gpus: int = 4, **kw: Any) -> dict[str, Any]:
    job = {"command": ["python", "train.py", "--epochs", "3"], "env": {"API_KEY": SECRET}}
    job.update(kw.pop("job", {}))
    return {"subject": "team", "pool": "p", "resources": {"gpu": gpus}, "job": job, **kw}


async def submit(s: Setup, **kw: Any) -> dict[str, Any]:
    made: dict[str, Any] = ok(
        await s.c.post("/v1/requests", headers=s.client, json=job_body(**kw)), 201
    )
    return made


def path(rid: object, action: str = "") -> str:
    return f"/v1/requests/{rid}" + (f"/{action}" if action else "")


async def test_a_job_is_created_and_its_env_values_never_shown(jobs: Setup) -> None:
    s = jobs
    made = await submit(s, job={"workdir": "/srv/run", "name": "train"})
    assert made["status"] == "allocated" and made["placement"]["node"] == "n1"
    assert made["job"]["command"] == ["python", "train.py", "--epochs", "3"]
    assert (made["job"]["workdir"], made["job"]["name"]) == ("/srv/run", "train")
    assert made["job"]["env_keys"] == ["API_KEY"]
    assert made["job"]["claimed"] is None and made["exit_code"] is None
    assert "env" not in made["job"]
    # Nowhere a reader looks: the document, the list, the events, the metrics.
    for url in (path(made["id"]), "/v1/requests", path(made["id"], "events")):
        answer = await s.c.get(url, headers=s.admin)
        assert answer.status_code == 200 and SECRET not in answer.text
    assert SECRET not in (await s.c.get("/metrics")).text
    # Only the claim answer carries the values, to the node's agent.
    claimed = ok(await s.c.post(path(made["id"], "claim"), headers=s.agent1, json={"attempt": 1}))
    assert claimed["job"]["env"] == {"API_KEY": SECRET}
    assert SECRET not in (await s.c.get(path(made["id"]), headers=s.agent1)).text


async def test_bad_jobs_are_refused_naming_the_field(jobs: Setup) -> None:
    s = jobs
    job_cases: list[tuple[object, str]] = [
        (["x"], "job"),
        ({"command": []}, "job.command"),
        ({"command": ["x", ""]}, "job.command"),
        ({"command": ["x"], "env": {"1BAD": "v"}}, "job.env.1BAD"),
        ({"command": ["x"], "name": "n" * 129}, "job.name"),
    ]
    for job, field in job_cases:
        body = {"subject": "team", "pool": "p", "resources": {"gpu": 1}, "job": job}
        answer = await s.c.post("/v1/requests", headers=s.client, json=body)
        err = error(answer, 400)
        assert err["field"].startswith(field), err
    listed = ok(await s.c.get("/v1/requests", headers=s.admin))
    assert listed["items"] == []  # nothing was stored


async def test_an_array_batch_numbers_its_members(jobs: Setup) -> None:
    s = jobs
    members = [job_body(gpus=1) for _ in range(3)]
    made = ok(
        await s.c.post(
            "/v1/requests/batch", headers=s.client, json={"members": members, "array": True}
        ),
        201,
    )
    assert [m["job"]["array_index"] for m in made["items"]] == [0, 1, 2]
    assert all("RESPOOL_ARRAY_INDEX" in m["job"]["env_keys"] for m in made["items"])
    second = made["items"][1]
    node = s.agent1 if second["placement"]["node"] == "n1" else s.agent2
    claimed = ok(await s.c.post(path(second["id"], "claim"), headers=node, json={"attempt": 1}))
    assert claimed["job"]["env"]["RESPOOL_ARRAY_INDEX"] == "1"
    # array without a job on every member: refused, nothing made
    members[2] = {"subject": "team", "pool": "p", "resources": {"gpu": 1}}
    answer = await s.c.post(
        "/v1/requests/batch", headers=s.client, json={"members": members, "array": True}
    )
    error(answer, 400, "array")
    assert len(ok(await s.c.get("/v1/requests", headers=s.admin))["items"]) == 3


async def test_an_attempt_is_claimed_once(jobs: Setup) -> None:
    s = jobs
    made = await submit(s)
    listed = ok(await s.c.get("/v1/agent/jobs", headers=s.agent1))
    assert [j["id"] for j in listed["items"]] == [made["id"]]
    assert ok(await s.c.get("/v1/agent/jobs", headers=s.agent2))["items"] == []
    first = ok(await s.c.post(path(made["id"], "claim"), headers=s.agent1, json={"attempt": 1}))
    assert first["job"]["claimed"]["node"] == "n1" and first["job"]["claimed"]["attempt"] == 1
    again = await s.c.post(path(made["id"], "claim"), headers=s.agent1, json={"attempt": 1})
    error(again, 409, "attempt")
    stale = await s.c.post(path(made["id"], "claim"), headers=s.agent1, json={"attempt": 2})
    error(stale, 409, "attempt")
    # claimed: no longer offered, but listed among the agent's claimed jobs
    assert ok(await s.c.get("/v1/agent/jobs", headers=s.agent1))["items"] == []
    mine = ok(await s.c.get("/v1/agent/jobs", headers=s.agent1, params={"claimed": "true"}))
    assert [j["id"] for j in mine["items"]] == [made["id"]]


async def test_concurrent_claims_of_one_attempt_one_wins(jobs: Setup) -> None:
    s = jobs
    made = await submit(s)
    answers = await asyncio.gather(
        *(
            s.c.post(path(made["id"], "claim"), headers=s.agent1, json={"attempt": 1})
            for _ in range(5)
        )
    )
    assert sorted(a.status_code for a in answers) == [200, 409, 409, 409, 409]


async def test_an_agent_reaches_only_its_nodes_jobs_and_clients_cannot_claim(
    jobs: Setup,
) -> None:
    s = jobs
    made = await submit(s)  # on n1
    rid = made["id"]
    # the agent of n2 cannot see it
    error(await s.c.get(path(rid), headers=s.agent2), 404)
    error(await s.c.post(path(rid, "claim"), headers=s.agent2, json={"attempt": 1}), 404)
    error(await s.c.post(path(rid, "release"), headers=s.agent2), 404)
    error(await s.c.get(path(rid, "logs"), headers=s.agent2), 404)
    error(await s.c.get(path(rid, "events"), headers=s.agent2), 404)
    log = {"attempt": 1, "seq": 0, "stream": "stdout", "data": "x"}
    error(await s.c.post(path(rid, "logs"), headers=s.agent2, json=log), 404)
    error(await s.c.post(path(rid, "heartbeat"), headers=s.agent2), 404)
    assert ok(await s.c.get("/v1/agent/jobs", headers=s.agent2))["items"] == []
    error(await s.c.get("/v1/requests", headers=s.agent2), 403)
    # the agent of n1 can read it; nothing but its routes and its jobs
    assert ok(await s.c.get(path(rid), headers=s.agent1))["id"] == rid
    error(await s.c.get("/v1/pools", headers=s.agent1), 403)
    error(await s.c.post("/v1/requests", headers=s.agent1, json=job_body()), 403)
    error(await s.c.post(path(rid, "cancel"), headers=s.agent1), 403)
    # clients and admins do not claim, send logs or call the agent routes
    for who in (s.client, s.admin):
        error(await s.c.post(path(rid, "claim"), headers=who, json={"attempt": 1}), 403)
        log = {"attempt": 1, "seq": 0, "stream": "stdout", "data": "x"}
        error(await s.c.post(path(rid, "logs"), headers=who, json=log), 403)
        error(await s.c.get("/v1/agent/jobs", headers=who), 403)
    assert ok(await s.c.get(path(rid), headers=s.admin))["job"]["claimed"] is None


async def test_logs_are_deduplicated_and_bounded_head_and_tail(jobs: Setup) -> None:
    s = jobs
    rid = (await submit(s))["id"]
    ok(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}))

    async def send(seq: int, data: str, stream: str = "stdout") -> None:
        body = {"attempt": 1, "seq": seq, "stream": stream, "data": data}
        ok(await s.c.post(path(rid, "logs"), headers=s.agent1, json=body), 204)

    await send(0, "hello\n")
    await send(1, "oops\n", "stderr")
    await send(1, "oops\n", "stderr")  # a retried send: stored once
    read = ok(await s.c.get(path(rid, "logs"), headers=s.client))
    assert [(c["seq"], c["stream"], c["data"]) for c in read["chunks"]] == [
        (0, "stdout", "hello\n"),
        (1, "stderr", "oops\n"),
    ]
    assert (read["attempt"], read["next"], read["truncated"], read["done"]) == (1, 1, False, False)
    # Far more than the bound: the head and the tail are kept, a marker between.
    for seq in range(2, 42):
        await send(seq, f"line {seq:03d} " + "x" * 90 + "\n")
    read = ok(await s.c.get(path(rid, "logs"), headers=s.client))
    text = "".join(c["data"] for c in read["chunks"])
    assert read["truncated"] is True and read["next"] == 41
    assert text.startswith("hello\noops\nline 002")
    assert text.endswith("line 041 " + "x" * 90 + "\n")
    assert "line 020" not in text
    markers = re.findall(r"\n?\[\.\.\. (\d+) bytes dropped \.\.\.\]\n", text)
    assert len(markers) == 1, text
    assert "\n[... " in text  # a line of its own
    kept = re.sub(r"\n?\[\.\.\. \d+ bytes dropped \.\.\.\]\n", "", text)
    assert len(kept.encode()) <= LOG_LIMIT
    assert len(kept.encode()) + int(markers[0]) == len("hello\noops\n") + 40 * 100
    # reading on after a seq
    after = ok(await s.c.get(path(rid, "logs"), headers=s.client, params={"after": 40}))
    assert [c["seq"] for c in after["chunks"]] == [41]


async def test_following_logs_answers_when_a_chunk_arrives(jobs: Setup) -> None:
    s = jobs
    rid = (await submit(s))["id"]
    ok(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}))
    follower = asyncio.create_task(
        s.c.get(path(rid, "logs"), headers=s.client, params={"after": -1, "wait": 10})
    )
    await waiting_clients(s.server, 1)
    body = {"attempt": 1, "seq": 0, "stream": "stdout", "data": "epoch 1\n"}
    ok(await s.c.post(path(rid, "logs"), headers=s.agent1, json=body), 204)
    read = ok(await asyncio.wait_for(follower, timeout=8))
    assert [c["data"] for c in read["chunks"]] == ["epoch 1\n"]


async def test_the_agents_job_list_waits_for_a_grant(jobs: Setup) -> None:
    s = jobs
    waiting = asyncio.create_task(s.c.get("/v1/agent/jobs", headers=s.agent1, params={"wait": 10}))
    await waiting_clients(s.server, 1)
    made = await submit(s)
    listed = ok(await asyncio.wait_for(waiting, timeout=8))
    assert [j["id"] for j in listed["items"]] == [made["id"]]


async def test_a_grant_wakes_the_agent_of_its_node_at_commit(jobs: Setup) -> None:
    """Granted at create, in a batch, or by a release: a NOTIFY keyed by the node's id (what
    the node's agent waits on), none for the other node."""
    s = jobs
    got: asyncio.Queue[str] = asyncio.Queue()
    async with direct(s.server.db_url) as conn:
        ids = {
            r["name"]: str(r["id"]) for r in await conn.fetch("SELECT name, id FROM respool.nodes")
        }
        await conn.add_listener("respool_request", lambda *a: got.put_nowait(a[3]))

        async def woken() -> set[str]:
            await asyncio.sleep(0.3)
            seen = set()
            while not got.empty():
                seen.add(json.loads(got.get_nowait())["id"])
            return seen & set(ids.values())

        first = await submit(s, node_selector={"node": "n1"})  # granted by its create
        assert await woken() == {ids["n1"]}
        members = [job_body(gpus=1, node_selector={"node": "n2"}) for _ in range(2)]
        ok(await s.c.post("/v1/requests/batch", headers=s.client, json={"members": members}), 201)
        assert await woken() == {ids["n2"]}
        waiting = await submit(s, node_selector={"node": "n1"})
        assert waiting["status"] == "queued" and await woken() == set()
        ok(await s.c.post(path(first["id"], "cancel"), headers=s.client))  # granted by a release
        assert await woken() == {ids["n1"]}
        plain = {"subject": "team", "pool": "p", "resources": {"gpu": 1}}  # not a job
        ok(await s.c.post("/v1/requests", headers=s.client, json=plain), 201)
        assert await woken() == set()


async def test_release_records_the_exit_code(jobs: Setup) -> None:
    s = jobs
    rid = (await submit(s))["id"]
    ok(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}))
    done = ok(
        await s.c.post(
            path(rid, "release"), headers=s.agent1, params={"attempt": 1}, json={"exit_code": 3}
        )
    )
    assert (done["status"], done["exit_code"]) == ("released", 3)
    assert ok(await s.c.get(path(rid), headers=s.client))["exit_code"] == 3
    logs = ok(await s.c.get(path(rid, "logs"), headers=s.client))
    assert logs["done"] is True
    # a stale attempt is refused
    error(
        await s.c.post(
            path(rid, "release"), headers=s.agent1, params={"attempt": 2}, json={"exit_code": 0}
        ),
        409,
        "attempt",
    )


async def test_a_lost_agents_node_takes_no_new_jobs_and_unclaimed_ones_requeue(
    jobs: Setup,
) -> None:
    s = jobs
    # n1's agent heartbeats every second, n2's every 300 s
    hb = ok(await s.c.post("/v1/agent/heartbeat", headers=s.agent1, json={"interval_seconds": 1}))
    assert hb == {"node": "n1", "pool": "p"}
    ok(await s.c.post("/v1/agent/heartbeat", headers=s.agent2, json={"interval_seconds": 300}))
    nodes = {n["name"]: n for n in ok(await s.c.get("/v1/nodes", headers=s.admin))}
    assert nodes["n1"]["agent"] == nodes["n2"]["agent"] == "ready"
    a = await submit(s)
    assert a["placement"]["node"] == "n1"  # never claimed
    later = await s.server.app.state.db.fetchval("SELECT now() + interval '10 seconds'")
    async with direct(s.server.db_url) as conn:
        await reconcile(conn, "p", later)
    nodes = {n["name"]: n for n in ok(await s.c.get("/v1/nodes", headers=s.admin))}
    assert (nodes["n1"]["agent"], nodes["n2"]["agent"]) == ("lost", "ready")
    moved = ok(await s.c.get(path(a["id"]), headers=s.client))
    # back to the queue with the same attempt, and granted on n2 in the same pass
    assert (moved["status"], moved["attempt"], moved["placement"]["node"]) == ("allocated", 1, "n2")
    events = ok(await s.c.get(path(a["id"], "events"), headers=s.client))
    assert ("allocated", "queued", "unclaimed") in [
        (e["from"], e["to"], e["reason"]) for e in events
    ]
    # n1 is free, but a new job does not go there: it waits
    b = await submit(s)
    assert b["status"] == "queued"
    # a request without a job still does
    plain = {"subject": "team", "pool": "p", "resources": {"gpu": 4}}
    c = ok(await s.c.post("/v1/requests", headers=s.client, json=plain), 201)
    assert (c["status"], c["placement"]["node"]) == ("allocated", "n1")
    ok(await s.c.post(path(c["id"], "release"), headers=s.client))
    # the agent comes back: the waiting job is granted there
    ok(await s.c.post("/v1/agent/heartbeat", headers=s.agent1, json={"interval_seconds": 1}))
    b = ok(await s.c.get(path(b["id"]), headers=s.client))
    assert (b["status"], b["placement"]["node"]) == ("allocated", "n1")


async def test_an_expired_job_lease_requeues_as_the_next_attempt(jobs: Setup) -> None:
    s = jobs
    made = await submit(s, max_retries=1, lease_seconds=30)
    rid = made["id"]
    ok(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}))
    db = s.server.app.state.db
    async with direct(s.server.db_url) as conn:
        await reconcile(conn, "p", await db.fetchval("SELECT now() + interval '1 minute'"))
    again = ok(await s.c.get(path(rid), headers=s.client))
    assert (again["status"], again["attempt"]) == ("allocated", 2)
    assert again["job"]["claimed"]["attempt"] == 1  # attempt 2 is not claimed yet
    events = ok(await s.c.get(path(rid, "events"), headers=s.client))
    assert ("allocated", "queued", "expired") in [(e["from"], e["to"], e["reason"]) for e in events]
    # the old attempt is fenced off, the new one claimable once
    error(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}), 409)
    node = s.agent1 if again["placement"]["node"] == "n1" else s.agent2
    ok(await s.c.post(path(rid, "claim"), headers=node, json={"attempt": 2}))
    # no retries left: the next lapse ends it
    async with direct(s.server.db_url) as conn:
        await reconcile(conn, "p", await db.fetchval("SELECT now() + interval '1 hour'"))
    final = ok(await s.c.get(path(rid), headers=s.client))
    assert (final["status"], final["reason"], final["attempt"]) == ("expired", "lease_expired", 2)


async def test_a_jobs_lease_runs_from_its_claim(jobs: Setup) -> None:
    s = jobs
    made = await submit(s, lease_seconds=5)
    rid = made["id"]
    assert made["status"] == "allocated" and made["lease_expires_at"] is None
    db = s.server.app.state.db
    # waiting for its agent (none ever ran on n1): no lease lapses, an hour later still waiting
    async with direct(s.server.db_url) as conn:
        await reconcile(conn, "p", await db.fetchval("SELECT now() + interval '1 hour'"))
    waiting = ok(await s.c.get(path(rid), headers=s.client))
    assert (waiting["status"], waiting["attempt"], waiting["lease_expires_at"]) == (
        "allocated",
        1,
        None,
    )
    # a client's heartbeat does not start it either
    hb = ok(await s.c.post(path(rid, "heartbeat"), headers=s.client, params={"attempt": 1}))
    assert hb["lease_expires_at"] is None
    before = await db.fetchval("SELECT now()")
    claimed = ok(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}))
    assert claimed["lease_expires_at"] is not None
    ends = datetime.fromisoformat(claimed["lease_expires_at"].replace("Z", "+00:00"))
    assert 4 <= (ends - before).total_seconds() <= 5 + 30  # claim + 5 s (a slow machine: +30)
    # from then on the lease governs it
    async with direct(s.server.db_url) as conn:
        await reconcile(conn, "p", await db.fetchval("SELECT now() + interval '1 minute'"))
    final = ok(await s.c.get(path(rid), headers=s.client))
    assert (final["status"], final["reason"], final["attempt"]) == ("expired", "lease_expired", 1)


async def test_a_job_waiting_for_a_lost_agent_goes_back_unclaimed_not_expired(
    jobs: Setup,
) -> None:
    s = jobs
    ok(await s.c.post("/v1/agent/heartbeat", headers=s.agent1, json={"interval_seconds": 5}))
    made = await submit(s, lease_seconds=2, node_selector={"node": "n1"})
    rid = made["id"]
    assert made["placement"]["node"] == "n1"
    db = s.server.app.state.db
    # 4 s on: the lease (had it run from the grant) would have lapsed; the agent is not lost yet
    async with direct(s.server.db_url) as conn:
        await reconcile(conn, "p", await db.fetchval("SELECT now() + interval '4 seconds'"))
    doc = ok(await s.c.get(path(rid), headers=s.client))
    assert (doc["status"], doc["attempt"]) == ("allocated", 1)
    # 3 intervals of silence: n1 is lost and the job goes back to the queue, same attempt
    async with direct(s.server.db_url) as conn:
        await reconcile(conn, "p", await db.fetchval("SELECT now() + interval '20 seconds'"))
    doc = ok(await s.c.get(path(rid), headers=s.client))
    assert (doc["status"], doc["reason"], doc["attempt"]) == ("queued", "unclaimed", 1)
    events = ok(await s.c.get(path(rid, "events"), headers=s.client))
    assert "expired" not in [e["to"] for e in events]


async def test_a_heartbeat_after_the_lease_lapsed_requeues_the_job(jobs: Setup) -> None:
    s = jobs
    rid = (await submit(s, max_retries=1, lease_seconds=30))["id"]
    ok(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}))
    # the heartbeat of attempt 1 arrives a minute on, before any reconciler pass
    async with direct(s.server.db_url) as conn:
        late = json.loads(
            await conn.fetchval(
                "SELECT respool.heartbeat_request($1::uuid, 1, now() + interval '1 minute')::text",
                rid,
            )
        )
    # not ended "expired": queued again as attempt 2 (and granted again at once)
    assert (late["status"], late["attempt"]) == ("allocated", 2), late
    events = ok(await s.c.get(path(rid, "events"), headers=s.client))
    assert ("allocated", "queued", "expired") in [(e["from"], e["to"], e["reason"]) for e in events]
    assert "expired" not in [e["to"] for e in events]
    # attempt 1 is refused everywhere: heartbeat, claim, release
    for action, kw in (
        ("heartbeat", {"params": {"attempt": 1}}),
        ("claim", {"json": {"attempt": 1}}),
        ("release", {"params": {"attempt": 1}, "json": {"exit_code": 0}}),
    ):
        answer = await s.c.post(path(rid, action), headers=s.agent1, **kw)
        assert answer.status_code == 409, (action, answer.text)
    # attempt 2, with no retries left: a late heartbeat ends it expired
    node = s.agent1 if late["placement"]["node"] == "n1" else s.agent2
    ok(await s.c.post(path(rid, "claim"), headers=node, json={"attempt": 2}))
    async with direct(s.server.db_url) as conn:
        ended = json.loads(
            await conn.fetchval(
                "SELECT respool.heartbeat_request($1::uuid, 2, now() + interval '1 hour')::text",
                rid,
            )
        )
    assert (ended["status"], ended["reason"], ended["attempt"]) == ("expired", "lease_expired", 2)


async def test_a_stale_attempts_late_output_is_refused_like_its_heartbeat(jobs: Setup) -> None:
    """Output of an attempt the job has left is 409 naming attempt, from the agent that ran it
    even once the job runs on another node; it is kept neither there nor under the new attempt."""
    s = jobs
    rid = (await submit(s, max_retries=1, lease_seconds=30))["id"]
    ok(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}))
    chunk = {"attempt": 1, "seq": 0, "stream": "stdout", "data": "before the lapse\n"}
    ok(await s.c.post(path(rid, "logs"), headers=s.agent1, json=chunk), 204)
    ok(await s.c.post("/v1/nodes/n1/cordon", headers=s.admin))
    db = s.server.app.state.db
    async with direct(s.server.db_url) as conn:
        await reconcile(conn, "p", await db.fetchval("SELECT now() + interval '1 minute'"))
    again = ok(await s.c.get(path(rid), headers=s.client))
    assert (again["status"], again["attempt"], again["placement"]["node"]) == ("allocated", 2, "n2")
    late = {"attempt": 1, "seq": 1, "stream": "stdout", "data": "after the lapse\n"}
    for when in ("before", "after"):  # attempt 2 claimed on n2 or not yet
        answer = error(
            await s.c.post(path(rid, "logs"), headers=s.agent1, json=late), 409, "attempt"
        )
        assert "stale attempt 1" in answer["detail"] and "attempt 2" in answer["detail"], answer
        for action, kw in (
            ("heartbeat", {"params": {"attempt": 1}}),
            ("release", {"params": {"attempt": 1}, "json": {"exit_code": 0}}),
        ):
            error(await s.c.post(path(rid, action), headers=s.agent1, **kw), 409, "attempt")
        if when == "before":
            ok(await s.c.post(path(rid, "claim"), headers=s.agent2, json={"attempt": 2}))
    # attempt 1 keeps what came in time; attempt 2 has nothing of it
    old = ok(await s.c.get(path(rid, "logs"), headers=s.client, params={"attempt": 1}))
    assert [c["data"] for c in old["chunks"]] == ["before the lapse\n"]
    now = ok(await s.c.get(path(rid, "logs"), headers=s.client))
    assert (now["attempt"], now["chunks"]) == (2, [])
    # an attempt not reached yet is 409 too
    ahead = {**late, "attempt": 3}
    error(await s.c.post(path(rid, "logs"), headers=s.agent2, json=ahead), 409, "attempt")
    ok(await s.c.post("/v1/nodes/n1/uncordon", headers=s.admin))


async def test_agent_tokens_are_bound_to_one_node_or_a_pool_without_nodes(jobs: Setup) -> None:
    async with direct(jobs.server.db_url) as conn:
        for kw, why in (
            ({}, "exactly one node"),
            ({"pool": "p"}, "pool p has nodes"),
            ({"node": "n9"}, "pool must name where the agent registers node n9"),
            ({"node": "Bad Name", "pool": "p"}, "node must match"),
        ):
            with pytest.raises(Exception) as refused:
                await tokens.create_token(conn, name="bad-agent", role="agent", **kw)
            assert why in str(refused.value)
        listed = {t.name: t for t in await tokens.list_tokens(conn)}
    assert (listed["agent-n2"].role, listed["agent-n2"].node) == ("agent", "n2")


async def test_a_restarted_agent_releases_a_claim_whose_processes_are_gone(jobs: Setup) -> None:
    s = jobs
    rid = (await submit(s))["id"]
    ok(await s.c.post(path(rid, "claim"), headers=s.agent1, json={"attempt": 1}))
    mine = ok(await s.c.get("/v1/agent/jobs", headers=s.agent1, params={"claimed": "true"}))
    assert [j["id"] for j in mine["items"]] == [rid]
    bad = {"reason": "bored"}
    error(await s.c.post(path(rid, "release"), headers=s.agent1, json=bad), 400, "reason")
    body = {"reason": "agent_restarted"}
    done = ok(
        await s.c.post(path(rid, "release"), headers=s.agent1, params={"attempt": 1}, json=body)
    )
    assert (done["status"], done["reason"], done["exit_code"]) == (
        "released",
        "agent_restarted",
        None,
    )


async def test_token_create_binds_an_agent_token_from_the_cli(jobs: Setup) -> None:
    cli = Cli(url=jobs.server.url, db_url=jobs.server.db_url)
    made = await cli.db(
        "token", "create", "--role", "agent", "--node", "n2", "--name", "a2", "-o", "json"
    )
    assert made.exit_code == 0, made.stderr
    shown = json.loads(made.stdout)
    # an existing node's token names its pool: where its agent would register it again
    assert (shown["role"], shown["node"], shown["pool"]) == ("agent", "n2", "p")
    table = (await cli.db("token", "list")).stdout
    assert "node n2 (pool p)" in table
    assert "exactly one" in failed(await cli.db("token", "create", "--role", "agent"), code=2)
    hb = await jobs.c.post(
        "/v1/agent/heartbeat", headers=bearer(shown["token"]), json={"interval_seconds": 5}
    )
    assert ok(hb) == {"node": "n2", "pool": "p"}
