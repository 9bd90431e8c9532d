"""``respool pool create/update --starvation-seconds/--ordering``, ``request create --dry-run
--max-seconds`` and the ETA in ``request describe`` (docs/scheduling.md)."""

from __future__ import annotations

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
    assert "dry run, nothing created: would be queued" in what.stderr
    assert "Would preempt: nothing" in what.stdout and "ETA" in what.stdout
    listed = await cli.json("request", "list", "--pool", "dry")
    assert [r["id"] for r in listed] == [holder["id"]]
    queued = await cli.json("request", "create", "-s", "team:dry", "--gpu", "1")
    table = (await cli.ok("request", "describe", queued["id"])).stdout
    assert "ETA" in table and "unknown (no hold history" in table
    rejected = await cli.api("request", "create", "-s", "team:dry", "--gpu", "5", "--dry-run")
    assert rejected.exit_code == 1 and "would be rejected" in rejected.stderr
