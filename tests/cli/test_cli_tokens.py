"""``respool token ...`` (database) and the CLI against an API with auth on."""

from __future__ import annotations

import json

from support.cli import Cli, failed
from support.server import running_server

ADMIN = "adm-" + "x" * 20


async def _token(cli: Cli, *args: str) -> dict[str, str]:
    result = await cli.db("token", "create", *args, "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert "not shown again" in result.stderr
    created: dict[str, str] = json.loads(result.stdout)
    return created


async def test_token_create_list_revoke(db_url: str) -> None:
    cli = Cli(url="http://127.0.0.1:1", db_url=db_url)  # no API needed: database commands
    reader = await _token(cli, "--role", "reader", "--name", "ops")
    assert reader["token"].startswith("rp_") and reader["role"] == "reader"
    client = await _token(cli, "--role", "client", "--subject", "team-a:*", "--subject", "ci")
    assert client["subject_patterns"] == ["team-a:*", "ci"] and client["name"].startswith("client-")

    table = await cli.db("token", "create", "--role", "admin", "--name", "root")
    assert table.exit_code == 0
    assert table.stdout.strip().splitlines()[-1].startswith("rp_")  # the token, on its own line

    listed = json.loads((await cli.db("token", "list", "-o", "json")).stdout)
    assert {t["name"] for t in listed} == {"ops", "root", client["name"]}
    assert all("token" not in t and "token_hash" not in t for t in listed)

    revoked = json.loads((await cli.db("token", "revoke", "ops", "-o", "json")).stdout)
    assert revoked["revoked_at"] is not None
    active = json.loads((await cli.db("token", "list", "-o", "json")).stdout)
    assert "ops" not in {t["name"] for t in active}
    everything = (await cli.db("token", "list", "--all")).stdout
    assert "ops" in everything and "reader" in everything

    assert "not found" in failed(await cli.db("token", "revoke", "ops"))  # already revoked
    assert "subject pattern" in failed(await cli.db("token", "create", "--role", "client"), 2)
    assert "already exists" in failed(
        await cli.db("token", "create", "--role", "admin", "--name", "root")
    )
    assert "'boss'" in failed(await cli.db("token", "create", "--role", "boss"), code=2)
    no_db = await cli.run("token", "list", RESPOOL_DATABASE_URL="postgresql://x@127.0.0.1:1/x")
    assert failed(no_db).startswith("cannot connect to the database")


async def test_tokens_against_the_api(db_url: str) -> None:
    async with running_server(db_url, auth="on", admin_token=ADMIN) as srv:
        cli = Cli(url=srv.url, db_url=db_url)
        reader = (await _token(cli, "--role", "reader", "--name", "r"))["token"]
        client = (await _token(cli, "--role", "client", "--subject", "team:*"))["token"]

        err = failed(await cli.api("pool", "list"))
        assert "authentication required" in err and "--token" in err
        await cli.ok("pool", "create", "p", "-c", "{gpu: 2}", "--token", ADMIN)
        await cli.ok("pool", "attach-policy", "p", "team:x", "--token", ADMIN)
        listed = await cli.api("pool", "list", "-o", "json", RESPOOL_TOKEN=reader)
        assert listed.exit_code == 0 and json.loads(listed.stdout)[0]["name"] == "p"

        manifest = "pools:\n  - name: q\n    capacity: {gpu: 1}\n"
        for token, role in ((reader, "reader"), (client, "client")):
            denied = await cli.api(
                "apply", "-f", "-", "--dry-run", "--token", token, input=manifest
            )
            assert role in failed(denied)
        plan = await cli.api("apply", "-f", "-", "--dry-run", "-o", "json", "--token", ADMIN,
                             input=manifest)  # fmt: skip
        assert plan.exit_code == 0 and json.loads(plan.stdout)["changes"][0]["pool"] == "q"

        req = await cli.api("request", "create", "-s", "team:x", "--gpu", "1", "-o", "json",
                            "--token", client)  # fmt: skip
        assert json.loads(req.stdout)["status"] == "allocated"
        assert "may not create requests" in failed(
            await cli.api("request", "create", "-s", "other", "--gpu", "1", "--token", client)
        )

        await cli.db("token", "revoke", "r")
        assert "revoked" in failed(await cli.api("pool", "list", "--token", reader))
