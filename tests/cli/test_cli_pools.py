"""``respool pool ...``: pools and policies, happy paths and error paths, against a live API."""

from __future__ import annotations

from support.cli import Cli, failed


async def test_create_list_describe(module_cli: Cli) -> None:
    cli = module_cli
    pool = await cli.json(
        "pool", "create", "basic", "-c", '{"gpu": 8, "step_run": 32}', "-d", "Shared GPUs"
    )
    assert pool["name"] == "basic"
    assert pool["capacity"] == {"gpu": 8, "step_run": 32}
    assert pool["description"] == "Shared GPUs"
    assert pool["queueing"] == "best_effort"

    listed = {p["name"]: p for p in await cli.json("pool", "list")}
    assert listed["basic"]["id"] == pool["id"]
    assert not any(listed["basic"]["usage"].values()) and listed["basic"]["queued"] == 0

    table = (await cli.ok("pool", "list")).stdout
    assert "basic" in table and "0/8" in table and "0/32" in table and pool["id"][:8] in table

    # describe by a unique id prefix, in YAML too
    described = await cli.json("pool", "describe", pool["id"][:8])
    assert described["pool"]["id"] == pool["id"]
    assert described["policies"] == [] and described["queue"] == [] and described["active"] == []
    yaml_out = (await cli.ok("pool", "describe", "basic", "-o", "yaml")).stdout
    assert "name: basic" in yaml_out and "capacity:" in yaml_out


async def test_capacity_accepts_yaml(module_cli: Cli) -> None:
    pool = await module_cli.json("pool", "create", "yamlcap", "-c", "{gpu: 2, tpu: 1}")
    assert pool["capacity"] == {"gpu": 2, "tpu": 1}
    pool = await module_cli.json("pool", "create", "yamlcap2", "--capacity", "gpu: 3")
    assert pool["capacity"] == {"gpu": 3}


async def test_create_errors(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "dup", "-c", '{"gpu": 1}')
    assert "already exists" in failed(await cli.api("pool", "create", "dup", "-c", '{"gpu": 1}'))
    assert "capacity" in failed(await cli.api("pool", "create", "neg", "-c", '{"gpu": -1}'), 2)
    assert "NAME: must match" in failed(await cli.api("pool", "create", "Bad Name"), code=2)
    # malformed option values are usage errors: exit code 2, still one line
    err = failed(await cli.api("pool", "create", "x", "-c", '{"gpu": 1.5}'), code=2)
    assert "--capacity" in err and "not an integer" in err
    assert "--capacity" in failed(await cli.api("pool", "create", "x", "-c", "[1, 2]"), code=2)
    assert "Missing argument" in failed(await cli.api("pool", "create"), code=2)
    assert "not found" in failed(await cli.api("pool", "describe", "nosuchpool"))


async def test_update(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "upd", "-c", '{"gpu": 8, "step_run": 32}')
    pool = await cli.json(
        "pool", "update", "upd", "-c", '{"gpu": 4, "step_run": 0}', "--queueing", "strict",
        "--grace", "30", "-d", "smaller",
    )  # fmt: skip
    assert pool["capacity"] == {"gpu": 4}
    assert pool["queueing"] == "strict"
    assert pool["preemption_grace_seconds"] == 30
    assert pool["description"] == "smaller"
    assert "nothing to update" in failed(await cli.api("pool", "update", "upd"), code=2)
    assert "queueing" in failed(await cli.api("pool", "update", "upd", "--queueing", "x"), code=2)
    assert "not found" in failed(await cli.api("pool", "update", "ghost", "-c", "{gpu: 1}"))


async def test_delete_asks_unless_yes(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "gone", "-c", '{"gpu": 2}')
    no = await cli.api("pool", "delete", "gone", input="n\n")
    assert no.exit_code == 1 and "Delete pool gone" in no.stderr
    assert no.stderr.rstrip().endswith("error: aborted")
    await cli.ok("pool", "describe", "gone")  # still there

    no_input = await cli.api("pool", "delete", "gone")  # no terminal: nothing confirms
    assert no_input.exit_code == 1
    await cli.ok("pool", "describe", "gone")

    yes = await cli.ok("pool", "delete", "gone", input="y\n")
    assert "deleted pool gone" in yes.stderr
    assert "not found" in failed(await cli.api("pool", "describe", "gone"))


async def test_delete_with_live_requests_needs_force(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "busy", "-c", '{"gpu": 2}')
    await cli.ok("pool", "attach-policy", "busy", "team:busy")
    req = await cli.json("request", "create", "-s", "team:busy", "--gpu", "1")
    assert req["status"] == "allocated"
    assert "force" in failed(await cli.api("pool", "delete", "busy", "-y"))
    await cli.ok("pool", "delete", "busy", "-y", "--force")
    after = await cli.json("request", "describe", req["id"])
    assert after["status"] == "cancelled" and after["reason"] == "pool_deleted"


async def test_attach_update_list_detach_policy(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "pol", "-c", '{"gpu": 8, "step_run": 16}')
    created = await cli.json(
        "pool", "attach-policy", "pol", "orchestrator:prod", "-p", "10", "-r", '{"gpu": 4}',
        "-l", "{gpu: 6, step_run: 4}",
    )  # fmt: skip
    assert created["priority"] == 10
    assert created["reserved"] == {"gpu": 4}
    assert created["limit"] == {"gpu": 6, "step_run": 4}

    # attach again: updates the same policy (maps merge, 0 removes a key)
    updated = await cli.json(
        "pool", "attach-policy", "pol", "orchestrator:prod", "-p", "5", "-l", '{"step_run": 0}'
    )
    assert updated["id"] == created["id"]
    assert updated["priority"] == 5
    assert updated["reserved"] == {"gpu": 4}
    assert updated["limit"] == {"gpu": 6}

    await cli.ok("pool", "attach-policy", "pol", "orchestrator:dev")
    listed = await cli.json("pool", "list-policies", "pol")
    assert [p["subject"] for p in listed] == ["orchestrator:dev", "orchestrator:prod"]
    only = await cli.json("pool", "list-policies", "--subject", "orchestrator:dev")
    assert [(p["pool"], p["subject"]) for p in only] == [("pol", "orchestrator:dev")]
    table = (await cli.ok("pool", "list-policies", "pol")).stdout
    assert "orchestrator:prod" in table and "gpu=4" in table and "gpu=6" in table

    # errors: reserved above capacity (409), reserved above limit (400), unknown pool
    assert "reserved" in failed(
        await cli.api("pool", "attach-policy", "pol", "orchestrator:dev", "-r", "{gpu: 5}")
    )
    assert "limit" in failed(
        await cli.api("pool", "attach-policy", "pol", "orchestrator:x", "-r", "{gpu: 2}",
                      "-l", "{gpu: 1}"), code=2,
    )  # fmt: skip
    assert "not found" in failed(await cli.api("pool", "attach-policy", "nopool", "a:b"))

    aborted = await cli.api("pool", "detach-policy", "pol", "orchestrator:dev", input="n\n")
    assert aborted.exit_code == 1
    await cli.ok("pool", "detach-policy", "pol", "orchestrator:dev", "-y")
    listed = await cli.json("pool", "list-policies", "pol")
    assert [p["subject"] for p in listed] == ["orchestrator:prod"]
    assert "has no policy" in failed(
        await cli.api("pool", "detach-policy", "pol", "orchestrator:dev", "-y")
    )


async def test_usage_bars_queue_and_views(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "bars", "-c", '{"gpu": 8}')
    await cli.ok("pool", "attach-policy", "bars", "team:bars", "-r", "{gpu: 2}")
    held = await cli.json("request", "create", "-s", "team:bars", "--gpu", "6")
    queued = await cli.json("request", "create", "-s", "team:bars", "--gpu", "4")
    assert held["status"] == "allocated" and queued["status"] == "queued"

    table = (await cli.ok("pool", "list")).stdout
    row = next(line for line in table.splitlines() if line.strip().startswith("bars"))
    assert "6/8" in row and "█" in row and "░" in row
    assert "1" in row.split("6/8", 1)[1]  # the queued count

    pool = next(p for p in await cli.json("pool", "list") if p["name"] == "bars")
    assert pool["usage"]["gpu"] == 6 and pool["queued"] == 1

    desc = (await cli.ok("pool", "describe", "bars")).stdout
    for text in ("Capacity", "Policies", "team:bars", "Queue (1)", "Holding (1)"):
        assert text in desc
    assert "waiting for gpu" in desc
    data = await cli.json("pool", "describe", "bars")
    assert [r["id"] for r in data["queue"]] == [queued["id"]]
    assert [r["id"] for r in data["active"]] == [held["id"]]
    assert data["policies"][0]["usage"]["gpu"] == 6
    assert data["policies"][0]["borrowed"] == {"gpu": 4}

    q = await cli.json("pool", "requests", "bars")
    assert [(r["id"], r["queue_position"]) for r in q] == [(queued["id"], 1)]
    active = await cli.json("pool", "requests", "bars", "--view", "active")
    assert [r["id"] for r in active] == [held["id"]]
    everything = await cli.json("pool", "requests", "bars", "--view", "all")
    assert {r["id"] for r in everything} == {held["id"], queued["id"]}
    assert "--view" in failed(await cli.api("pool", "requests", "bars", "--view", "x"), code=2)
    assert "not found" in failed(await cli.api("pool", "requests", "nobars"))
