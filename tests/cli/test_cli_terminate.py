"""``respool request terminate ID [--force] [--reason TEXT]`` (docs/preemption.md,
"Terminate"): the request as it ends up, ``-o json|yaml``, and one-line errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import yaml

from app.db import policies as db_policies
from support.cli import Cli, failed
from support.db import direct, issue_tokens
from support.server import running_server


async def _pool(cli: Cli, name: str, *options: str, reserved: int = 0) -> str:
    """Pool ``name`` of 4 GPUs (``options``: its other settings) with a policy of subject
    ``team:<name>`` reserving ``reserved`` GPUs (made in the database); the subject."""
    await cli.ok("pool", "create", name, "-c", '{"gpu": 4}', *options)
    async with direct(cli.db_url) as conn:
        await db_policies.create_policy(
            conn, subject=f"team:{name}", pool=name, reserved={"gpu": reserved}
        )
    return f"team:{name}"


async def test_grace_then_forced_with_json_and_yaml(cli: Cli) -> None:
    subject = await _pool(cli, "g", "--grace", "300")
    req = await cli.json("request", "create", "-s", subject, "--gpu", "2", "--max-retries", "2")
    result = await cli.ok(
        "request", "terminate", req["id"][:8], "--reason", "node maintenance", "-o", "yaml"
    )
    shown = yaml.safe_load(result.stdout)
    assert (shown["status"], shown["reason"]) == ("preempting", "terminated")
    assert shown["message"] == "terminated by an admin: node maintenance; release within 300 s"
    assert f"request {req['id']}: preempting in pool g (terminated)" in result.stderr
    forced = await cli.json("request", "terminate", req["id"], "--force")
    assert (forced["status"], forced["reason"], forced["attempt"]) == (
        "preempted",
        "terminated",
        1,
    )
    table = await cli.ok("request", "terminate", req["id"])  # finished: left as it is
    assert "preempted" in table.stdout and "terminated" in table.stderr


async def test_no_grace_is_preempted_at_once(cli: Cli) -> None:
    subject = await _pool(cli, "n")
    req = await cli.json("request", "create", "-s", subject, "--gpu", "4")
    queued = await cli.json("request", "create", "-s", subject, "--gpu", "4")
    done = await cli.json("request", "terminate", req["id"], "--reason", "runaway")
    assert (done["status"], done["message"]) == ("preempted", "terminated by an admin: runaway")
    assert (await cli.json("request", "describe", queued["id"]))["status"] == "allocated"


async def test_non_preemptible_is_a_one_line_error_until_forced(cli: Cli) -> None:
    subject = await _pool(cli, "np", reserved=4)
    req = await cli.json("request", "create", "-s", subject, "--gpu", "1", "--non-preemptible")
    assert req["status"] == "allocated"
    message = failed(await cli.api("request", "terminate", req["id"]))
    assert message == f"request {req['id']} is not preemptible: terminate it with --force"
    assert (await cli.json("request", "describe", req["id"]))["status"] == "allocated"
    done = await cli.json("request", "terminate", req["id"], "--force")
    assert (done["status"], done["reason"]) == ("preempted", "terminated")


async def test_queued_is_cancelled(cli: Cli) -> None:
    subject = await _pool(cli, "q")
    await cli.json("request", "create", "-s", subject, "--gpu", "4")
    queued = await cli.json("request", "create", "-s", subject, "--gpu", "1")
    done = await cli.json("request", "terminate", queued["id"])
    assert (done["status"], done["reason"]) == ("cancelled", "terminated")


async def test_bad_reason_and_unknown_id_are_one_line_errors(cli: Cli) -> None:
    subject = await _pool(cli, "b")
    req = await cli.json("request", "create", "-s", subject, "--gpu", "1")
    message = failed(
        await cli.api("request", "terminate", req["id"], "--reason", "x" * 2001), code=2
    )
    assert message.startswith("--reason")
    assert (await cli.json("request", "describe", req["id"]))["status"] == "allocated"
    assert "not found" in failed(
        await cli.api("request", "terminate", "00000000-0000-0000-0000-000000000007")
    )


@pytest.fixture
async def authed_cli(db_url: str) -> AsyncIterator[tuple[Cli, dict[str, str]]]:
    issued = await issue_tokens(db_url)  # client: team-a:*
    async with running_server(db_url, auth="on") as srv:
        yield Cli(url=srv.url, db_url=db_url), issued


async def test_a_client_token_is_refused(authed_cli: tuple[Cli, dict[str, str]]) -> None:
    cli, tokens = authed_cli
    admin = ("--token", tokens["admin"])
    await cli.ok("pool", "create", "p", "-c", '{"gpu": 4}', *admin)
    async with direct(cli.db_url) as conn:
        await db_policies.create_policy(conn, subject="team-a:x", pool="p")
    as_client = ("--token", tokens["client"])
    made = await cli.ok(
        "request", "create", "-s", "team-a:x", "--gpu", "1", "-o", "json", *as_client
    )
    rid = json.loads(made.stdout)["id"]
    message = failed(await cli.api("request", "terminate", rid, *as_client))
    assert "only an admin may terminate" in message
    done = json.loads((await cli.ok("request", "terminate", rid, "-o", "json", *admin)).stdout)
    assert done["status"] == "preempted"
