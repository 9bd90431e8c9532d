"""``respool request ...``: create (with --wait), inspect, act, prune; errors are one line."""

from __future__ import annotations

import asyncio
import json

from support.cli import Cli, failed


async def _pool(cli: Cli, name: str, capacity: str = '{"gpu": 8}', *policy: str) -> None:
    await cli.ok("pool", "create", name, "-c", capacity)
    await cli.ok("pool", "attach-policy", name, f"team:{name}", *policy)


async def test_create_describe_events_release_delete(module_cli: Cli) -> None:
    cli = module_cli
    await _pool(cli, "life")
    created = await cli.ok(
        "request", "create", "-s", "team:life", "--gpu", "2", "--cpu", "8.05",
        "--memory", "1GiB", "--label", "run=nightly", "--label", "step=train", "-o", "json",
    )  # fmt: skip
    assert "allocated in pool life" in created.stderr
    req = json.loads(created.stdout)
    assert req["status"] == "allocated" and req["pool"] == "life"
    # settings are converted by the server: 8.05 CPUs → 8050 mcpu, 1 GiB → 1074 MB
    assert req["resources"] == {"gpu": 2, "mcpu": 8050, "memory_mb": 1074, "step_run": 1}
    assert req["labels"] == {"run": "nightly", "step": "train"}

    same = await cli.json("request", "describe", req["id"])
    assert same["id"] == req["id"] and same["version"] == req["version"]
    by_prefix = await cli.json("request", "describe", req["id"][:8])  # as tables show it
    assert by_prefix["id"] == req["id"]
    table = (await cli.ok("request", "describe", req["id"])).stdout
    assert "allocated" in table and "gpu=2" in table and "run=nightly" in table

    released = await cli.json("request", "release", req["id"][:8])
    assert released["status"] == "released"
    history = await cli.json("request", "events", req["id"])
    assert [(e["from"], e["to"]) for e in history][-2:] == [
        ("queued", "allocated"),
        ("allocated", "released"),
    ]
    assert "released" in (await cli.ok("request", "events", req["id"])).stdout

    await cli.ok("request", "delete", req["id"])
    assert "not found" in failed(await cli.api("request", "describe", req["id"]))


async def test_cancel_fencing_and_delete_live(module_cli: Cli) -> None:
    cli = module_cli
    await _pool(cli, "fence")
    req = await cli.json("request", "create", "-s", "team:fence", "--gpu", "1")
    assert "terminal" in failed(await cli.api("request", "delete", req["id"]))  # live: 409
    stale = failed(await cli.api("request", "cancel", req["id"], "--attempt", "2"))
    assert "attempt" in stale
    cancelled = await cli.json("request", "cancel", req["id"], "--attempt", "1")
    assert cancelled["status"] == "cancelled"
    await cli.ok("request", "delete", req["id"])


async def test_rejected_exits_1_with_the_request(module_cli: Cli) -> None:
    cli = module_cli
    await _pool(cli, "rej", '{"gpu": 2}')
    result = await cli.api("request", "create", "-s", "team:rej", "--gpu", "3", "-o", "json")
    assert result.exit_code == 1
    req = json.loads(result.stdout)
    assert req["status"] == "rejected" and req["reason"] == "exceeds_capacity"
    assert "rejected (exceeds_capacity)" in result.stderr
    # a subject without a policy: rejected too
    nopol = await cli.api("request", "create", "-s", "nobody", "--gpu", "1", "-o", "json")
    assert nopol.exit_code == 1 and '"no_policy"' in nopol.stdout


async def test_create_input_errors(module_cli: Cli) -> None:
    cli = module_cli
    await _pool(cli, "bad")
    assert "step_run" in failed(
        await cli.api("request", "create", "-s", "team:bad", "-r", "step_run=1"), code=2
    )
    assert "memory" in failed(
        await cli.api("request", "create", "-s", "team:bad", "--memory", "8XB"), code=2
    )
    assert "KEY=VALUE" in failed(
        await cli.api("request", "create", "-s", "team:bad", "-r", "tpu"), code=2
    )
    assert "integer" in failed(
        await cli.api("request", "create", "-s", "team:bad", "-r", "tpu=x"), code=2
    )
    assert "not a number" in failed(
        await cli.api("request", "create", "-s", "team:bad", "--cpu", "lots"), code=2
    )
    assert "--subject" in failed(await cli.api("request", "create", "--gpu", "1"), code=2)
    assert "not a request id" in failed(await cli.api("request", "describe", "not-an-id"), code=2)
    assert "no request id starts with ffff0000" in failed(
        await cli.api("request", "describe", "ffff0000")
    )
    assert "not found" in failed(
        await cli.api("request", "create", "-s", "team:bad", "--pool", "nopool", "--gpu", "1")
    )


async def test_wait_timeout_cancels_or_keeps(module_cli: Cli) -> None:
    cli = module_cli
    await _pool(cli, "full", '{"gpu": 1}')
    await cli.json("request", "create", "-s", "team:full", "--gpu", "1")

    result = await cli.api(
        "request", "create", "-s", "team:full", "--gpu", "1", "--wait", "0.5", "-o", "json"
    )
    assert result.exit_code == 1
    req = json.loads(result.stdout)
    assert req["status"] == "cancelled"
    said = [line for line in result.stderr.splitlines() if "cancel" in line]
    assert said == [f"request {req['id']}: not allocated within 0.5s; cancelled"]  # once

    kept = await cli.api(
        "request", "create", "-s", "team:full", "--gpu", "1", "--wait", "0.5", "--keep-queued",
        "-o", "json",
    )  # fmt: skip
    assert kept.exit_code == 1
    req = json.loads(kept.stdout)
    assert req["status"] == "queued" and req["queue_position"] == 1
    assert "it stays queued" in kept.stderr


async def test_list_filters(module_cli: Cli) -> None:
    cli = module_cli
    await _pool(cli, "listed")
    a = await cli.json("request", "create", "-s", "team:listed", "--gpu", "8")
    b = await cli.json("request", "create", "-s", "team:listed", "--gpu", "1")
    assert (a["status"], b["status"]) == ("allocated", "queued")
    mine = await cli.json("request", "list", "--pool", "listed")
    assert [r["id"] for r in mine] == [b["id"], a["id"]]  # newest first
    queued = await cli.json("request", "list", "--subject", "team:listed", "--status", "queued")
    assert [r["id"] for r in queued] == [b["id"]]
    one = await cli.json("request", "list", "--pool", "listed", "--limit", "1")
    assert [r["id"] for r in one] == [b["id"]]
    assert "status" in failed(await cli.api("request", "list", "--status", "sleeping"), code=2)


async def test_prune_older_than(cli: Cli) -> None:
    await _pool(cli, "old")
    done = await cli.json("request", "create", "-s", "team:old", "--gpu", "1")
    await cli.ok("request", "release", done["id"])
    live = await cli.json("request", "create", "-s", "team:old", "--gpu", "1")

    assert (await cli.json("request", "prune", "--older-than", "7d"))["pruned"] == 0
    await asyncio.sleep(0.01)
    pruned = await cli.ok("request", "prune", "--older-than", "0s")
    assert "deleted 1 requests finished before" in pruned.stderr
    assert "not found" in failed(await cli.api("request", "describe", done["id"]))
    assert (await cli.json("request", "describe", live["id"]))["status"] == "allocated"

    assert "duration" in failed(await cli.api("request", "prune", "--older-than", "soon"), code=2)
    assert "--older-than" in failed(await cli.api("request", "prune"), code=2)


async def test_create_lease_values(module_cli: Cli) -> None:
    """--lease: left out, the server's default; ``none``, no lease at all; a duration or a
    number of seconds, that lease. Anything else is refused before anything is sent."""
    cli = module_cli
    await _pool(cli, "leases")
    base = ["request", "create", "-s", "team:leases", "--gpu", "1"]
    assert (await cli.json(*base))["lease_seconds"] == 300  # the server's default
    assert (await cli.json(*base, "--lease", "none"))["lease_seconds"] is None
    assert (await cli.json(*base, "--lease", "None"))["lease_seconds"] is None
    assert (await cli.json(*base, "--lease", "5m"))["lease_seconds"] == 300
    assert (await cli.json(*base, "--lease", "90"))["lease_seconds"] == 90
    for bad in ("0", "1.5", "soon", ""):
        assert "--lease" in failed(await cli.api(*base, "--lease", bad), 2)
