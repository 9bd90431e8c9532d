"""POST /v1/requests/{id}/terminate (docs/preemption.md, "Terminate"): admin only; a
preemptible allocation goes through preempting with the pool's grace, a non-preemptible one
answers 409 unless force, a second forced call ends a preempting request at once, and a
terminated request is never requeued."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.db import policies as db_policies
from support.db import direct, issue_tokens
from support.http import error, get_request, make_request, ok, team_gpu
from support.server import Server, running_server

ADMIN_TOKEN = "test-admin-token-terminate-0123456789"


def terminate(rid: object) -> str:
    return f"/v1/requests/{rid}/terminate"


async def policy(server: Server, subject: str, **kw: Any) -> None:
    """A policy of ``subject`` on pool ``p``, made in the database (policies are not what this
    file tests)."""
    async with direct(server.db_url) as conn:
        await db_policies.create_policy(conn, subject=subject, pool="p", **kw)


async def graced(server: Server, grace: int = 30, gpus: int = 4, **kw: Any) -> httpx.AsyncClient:
    """Pool ``p`` of ``gpus`` GPUs with this grace period and a policy of ``team`` (``kw``: its
    fields); the API client."""
    c = server.client
    body = {"name": "p", "capacity": {"gpu": gpus}, "preemption_grace_seconds": grace}
    ok(await c.post("/v1/pools", json=body), 201)
    await policy(server, "team", **kw)
    return c


async def test_grace_goes_through_preempting_and_a_waiting_holder_hears_it(
    server: Server,
) -> None:
    c = await graced(server)
    r = await make_request(c, pool="p", resources={"gpu": 2}, max_retries=2)
    waiter = asyncio.create_task(
        c.get(f"/v1/requests/{r['id']}", params={"wait": 10, "version": r["version"]})
    )
    await asyncio.sleep(0.2)  # let the long-poll register (not a clock for the engine)
    start = time.monotonic()
    done = ok(await c.post(terminate(r["id"]), json={"reason": "node maintenance"}))
    heard = ok(await asyncio.wait_for(waiter, timeout=5))
    assert time.monotonic() - start < 1.0
    assert (done["status"], done["reason"]) == ("preempting", "terminated")
    assert done["message"] == "terminated by an admin: node maintenance; release within 30 s"
    assert (heard["status"], heard["reason"]) == ("preempting", "terminated")
    # the holder releases within the grace period: preempted, not queued again
    released = ok(await c.post(f"/v1/requests/{r['id']}/release"))
    assert (released["status"], released["reason"], released["attempt"]) == (
        "preempted",
        "terminated",
        1,
    )
    events = ok(await c.get(f"/v1/requests/{r['id']}/events"))
    assert [(e["to"], e["reason"]) for e in events[-2:]] == [
        ("preempting", "terminated"),
        ("preempted", "terminated"),
    ]


async def test_no_grace_frees_the_units_for_the_queue_at_once(server: Server) -> None:
    c = await graced(server, grace=0)
    r = await make_request(c, pool="p", resources={"gpu": 4}, max_retries=3)
    waiting = await make_request(c, pool="p", resources={"gpu": 2})
    assert waiting["status"] == "queued"
    done = ok(await c.post(terminate(r["id"]), json={"reason": "runaway"}))
    assert (done["status"], done["reason"], done["message"]) == (
        "preempted",
        "terminated",
        "terminated by an admin: runaway",
    )
    assert (await get_request(c, waiting["id"]))["status"] == "allocated"
    assert (await get_request(c, r["id"]))["status"] == "preempted"  # not requeued


async def test_non_preemptible_answers_409_unless_force(server: Server) -> None:
    c = await graced(server, reserved={"gpu": 4})
    r = await make_request(c, pool="p", resources={"gpu": 2}, preemptible=False)
    assert r["status"] == "allocated"
    body = error(await c.post(terminate(r["id"]), json={"reason": "x"}), 409, "force")
    assert "not preemptible" in body["detail"]
    assert (await get_request(c, r["id"]))["version"] == r["version"]
    done = ok(await c.post(terminate(r["id"]), json={"force": True, "reason": "x"}))
    assert (done["status"], done["reason"]) == ("preempting", "terminated")


async def test_second_forced_call_ends_it_at_once(server: Server) -> None:
    c = await graced(server, grace=300)
    r = await make_request(c, pool="p", resources={"gpu": 4}, max_retries=1)
    waiting = await make_request(c, pool="p", resources={"gpu": 4})
    first = ok(await c.post(terminate(r["id"]), json={}))
    assert first["status"] == "preempting"
    unforced = ok(await c.post(terminate(r["id"]), json={"reason": "again"}))
    assert (unforced["status"], unforced["version"]) == ("preempting", first["version"])
    forced = ok(await c.post(terminate(r["id"]), json={"force": True}))
    assert (forced["status"], forced["reason"], forced["attempt"]) == (
        "preempted",
        "terminated",
        1,
    )
    assert (await get_request(c, waiting["id"]))["status"] == "allocated"


async def test_a_gang_goes_whole(server: Server) -> None:
    c = await graced(server, grace=0)
    body = {"members": [team_gpu(max_retries=2) for _ in range(3)], "all_or_nothing": True}
    items = ok(await c.post("/v1/requests/batch", json=body), 201)["items"]
    assert {m["status"] for m in items} == {"allocated"}
    ok(await c.post(terminate(items[0]["id"]), json={"reason": "bye"}))
    listed = ok(await c.get("/v1/requests", params={"gang_id": items[0]["gang_id"]}))["items"]
    assert {(m["status"], m["reason"]) for m in listed} == {("preempted", "terminated")}


async def test_queued_is_cancelled_and_terminal_is_unchanged(server: Server) -> None:
    c = await graced(server, grace=0, gpus=1)
    holder = await make_request(c, pool="p", resources={"gpu": 1})
    queued = await make_request(c, pool="p", resources={"gpu": 1})
    done = ok(await c.post(terminate(queued["id"]), json={"reason": "no"}))
    assert (done["status"], done["reason"]) == ("cancelled", "terminated")
    released = ok(await c.post(f"/v1/requests/{holder['id']}/release"))
    again = ok(await c.post(terminate(holder["id"]), json={"force": True}))
    assert (again["status"], again["version"]) == ("released", released["version"])


async def test_unknown_id_is_404(server: Server) -> None:
    error(
        await server.client.post(terminate("00000000-0000-0000-0000-000000000007"), json={}),
        404,
        "id",
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"force": "yes"}, "force"),
        ({"force": 1}, "force"),
        ({"reason": 5}, "reason"),
        ({"reason": "x" * 2001}, "reason"),
        ({"reason": "a\u0000b"}, "reason"),
        ({"force": None}, "force"),
        ({"forse": True}, "forse"),
    ],
)
async def test_bad_body_is_400_naming_the_field(
    server: Server, body: dict[str, Any], field: str
) -> None:
    c = await graced(server, grace=0, gpus=1)
    r = await make_request(c, pool="p", resources={"gpu": 1})
    error(await c.post(terminate(r["id"]), json=body), 400, field)
    after = await get_request(c, r["id"])
    assert (after["status"], after["version"]) == ("allocated", r["version"])


async def test_no_body_takes_the_defaults(server: Server) -> None:
    c = await graced(server, grace=0, gpus=1)
    r = await make_request(c, pool="p", resources={"gpu": 1})
    done = ok(await c.post(terminate(r["id"])))
    assert (done["status"], done["message"]) == ("preempted", "terminated by an admin")
    other = await make_request(c, pool="p", resources={"gpu": 1})
    headers = {"Content-Type": "application/json"}
    done = ok(await c.post(terminate(other["id"]), content=b"null", headers=headers))
    assert (done["status"], done["reason"]) == ("preempted", "terminated")


# --- who may terminate -----------------------------------------------------------------------


@pytest.fixture
async def authed(db_url: str) -> AsyncIterator[tuple[Server, dict[str, dict[str, str]]]]:
    issued = await issue_tokens(db_url)  # client: team-a:*
    headers = {k: {"Authorization": f"Bearer {v}"} for k, v in issued.items()}
    headers["env_admin"] = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with running_server(db_url, auth="on", admin_token=ADMIN_TOKEN) as srv:
        h = headers["admin"]
        pool = {"name": "p", "capacity": {"gpu": 4}}
        ok(await srv.client.post("/v1/pools", headers=h, json=pool), 201)
        for subject in ("team-a:x", "team-b:y"):
            await policy(srv, subject)
        yield srv, headers


async def test_client_and_reader_tokens_get_403(
    authed: tuple[Server, dict[str, dict[str, str]]],
) -> None:
    srv, headers = authed
    c = srv.client
    body = {"subject": "team-a:x", "resources": {"gpu": 1}}
    own = ok(await c.post("/v1/requests", headers=headers["client"], json=body), 201)
    answer = error(
        await c.post(terminate(own["id"]), headers=headers["client"], json={"force": True}), 403
    )
    assert "only an admin" in answer["detail"]
    error(await c.post(terminate(own["id"]), headers=headers["reader"], json={}), 403)
    assert (await c.get(f"/v1/requests/{own['id']}", headers=headers["admin"])).json()[
        "status"
    ] == "allocated"
    # another subject's request stays invisible to a client token: 404, as for every request route
    body = {"subject": "team-b:y", "resources": {"gpu": 1}}
    other = ok(await c.post("/v1/requests", headers=headers["admin"], json=body), 201)
    error(await c.post(terminate(other["id"]), headers=headers["client"], json={}), 404)
    error(await c.post(terminate(other["id"]), headers={}, json={}), 401)
    # admin tokens (a token of role admin, and RESPOOL_ADMIN_TOKEN) may
    for role, rid in (("admin", own["id"]), ("env_admin", other["id"])):
        done = ok(await c.post(terminate(rid), headers=headers[role], json={}))
        assert (done["status"], done["reason"]) == ("preempted", "terminated")
