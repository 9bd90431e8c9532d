"""``respool pool create/update --starvation-seconds/--ordering``, ``request create --dry-run
--max-seconds`` and the ETA in ``request describe`` (docs/scheduling.md)."""

from __future__ import annotations

import re

from support.cli import Cli


async def test_pool_scheduling_options(module_cli: Cli) -> None:
    cli = module_cli
    made = await cli.json("pool", "create", "sched", "-c", '{"gpu": 2}', "--ordering", "fair",
                          "--starvation-seconds", "off")  # fmt: skip
    assert (made["starvation_seconds"], made["ordering"]) == (None, "fair")
    updated = await cli.json("pool", "update", "sched", "--starvation-seconds", "120")
    assert (updated["starvation_seconds"], updated["ordering"]) == (120, "fair")
    table = (await cli.ok("pool", "describe", "sched")).stdout
    assert "Starvation guard" in table and "120s" in table and "fair" in table
    bad = await cli.api("pool", "update", "sched", "--starvation-seconds", "soon")
    assert bad.exit_code != 0 and "off" in bad.stderr


async def test_dry_run_creates_nothing_and_describe_shows_eta(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "dry", "-c", '{"gpu": 1}')
    await cli.ok("pool", "attach-policy", "dry", "team:dry")
    holder = await cli.json("request", "create", "-s", "team:dry", "--gpu", "1",
                            "--max-seconds", "3600")  # fmt: skip
    assert holder["status"] == "allocated" and holder["max_seconds"] == 3600
    what = await cli.ok("request", "create", "-s", "team:dry", "--gpu", "1", "--dry-run")
    assert "dry run, nothing created: would wait: #1 in queue in pool dry" in what.stderr
    plan = what.stdout
    assert plan.startswith("Dry run: nothing was created.")
    assert "would wait: #1 in queue in pool dry: waiting for gpu" in plan
    assert re.search(r"Would preempt\s+nothing", plan) and "ETA" in plan
    # a plan, not a request: no id, no creation time, no lease deadline
    for word in ("Request ", "Created", "Lease until", "Allocated", "Finished"):
        assert word not in plan, plan
    listed = await cli.json("request", "list", "--pool", "dry")
    assert [r["id"] for r in listed] == [holder["id"]]
    queued = await cli.json("request", "create", "-s", "team:dry", "--gpu", "1")
    table = (await cli.ok("request", "describe", queued["id"])).stdout
    assert "ETA" in table and "unknown (fewer than 10 recorded holds" in table
    rejected = await cli.api("request", "create", "-s", "team:dry", "--gpu", "5", "--dry-run")
    assert rejected.exit_code == 1 and "would be rejected" in rejected.stderr


async def test_dry_run_names_the_preemptions_and_the_grace(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "dry-pre", "-c", '{"gpu": 4}', "--grace", "5")
    await cli.ok("pool", "attach-policy", "dry-pre", "low:*")
    await cli.ok("pool", "attach-policy", "dry-pre", "high", "-p", "10", "-r", '{"gpu": 4}')
    held = [
        await cli.json("request", "create", "-s", "low:a", "--pool", "dry-pre", "--gpu", "1")
        for _ in range(4)
    ]
    what = await cli.ok(
        "request", "create", "-s", "high", "--pool", "dry-pre", "--gpu", "2", "--dry-run"
    )
    outcome = "would be allocated after 2 preemptions in pool dry-pre (grace 5 s)"
    assert f"dry run, nothing created: {outcome}" in what.stderr
    assert outcome in what.stdout and "Would preempt" in what.stdout
    victims = [line for line in what.stdout.splitlines() if "low:a" in line]
    assert len(victims) == 2
    assert all(any(str(h["id"])[:8] in line for h in held) for line in victims)
    await cli.ok("pool", "create", "dry-now", "-c", '{"gpu": 1}')
    await cli.ok("pool", "attach-policy", "dry-now", "high")
    now = await cli.ok("request", "create", "-s", "high", "--pool", "dry-now", "--gpu", "1",
                       "--dry-run")  # fmt: skip
    assert "would be allocated now in pool dry-now" in now.stdout
    assert await cli.json("request", "list", "--pool", "dry-now") == []
