"""A pool's ``slice_overuse`` on the command line (docs/cli.md; docs/placement.md, "On the step
side"): ``pool create/update --slice-overuse``, ``pool describe``, and the pools file
(``export`` writes it when it is not the default, ``apply`` sets and changes it); and the slice
options of ``request create`` as they reach the server."""

from __future__ import annotations

from pathlib import Path

import yaml

from support.cli import Cli, failed

POOLS = """
pools:
  - name: notebooks
    capacity: {gpu_memory_mb: 81920, gpu_share: 100}
    slice_overuse: terminate
    policies:
      - subject: "team:nb"
"""


async def test_create_update_and_describe(cli: Cli) -> None:
    made = await cli.json("pool", "create", "nb", "-c", "{gpu_memory_mb: 81920}")
    assert made["slice_overuse"] == "report"  # the default
    changed = await cli.json("pool", "update", "nb", "--slice-overuse", "terminate")
    assert changed["slice_overuse"] == "terminate"
    shown = (await cli.ok("pool", "describe", "nb")).stdout
    assert "Slice overuse" in shown and "terminate" in shown
    err = failed(await cli.api("pool", "update", "nb", "--slice-overuse", "kill"), code=2)
    assert "--slice-overuse" in err
    again = await cli.json("pool", "create", "nb2", "--slice-overuse", "terminate")
    assert again["slice_overuse"] == "terminate"


async def test_the_pools_file_carries_it(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS)
    await cli.ok("apply", "-f", str(path))
    assert (await cli.json("pool", "describe", "notebooks"))["pool"]["slice_overuse"] == "terminate"
    exported = yaml.safe_load((await cli.ok("export")).stdout)
    (pool,) = [p for p in exported["pools"] if p["name"] == "notebooks"]
    assert pool["slice_overuse"] == "terminate"

    # back to the default: the plan says so, the pool follows, export leaves the field out
    path.write_text(POOLS.replace("    slice_overuse: terminate\n", ""))
    plan = await cli.json("apply", "-f", str(path))
    assert any("slice_overuse" in str(change) for change in plan["changes"]), plan
    assert (await cli.json("pool", "describe", "notebooks"))["pool"]["slice_overuse"] == "report"
    exported = yaml.safe_load((await cli.ok("export")).stdout)
    (pool,) = [p for p in exported["pools"] if p["name"] == "notebooks"]
    assert "slice_overuse" not in pool


async def test_request_create_sends_the_slice(cli: Cli) -> None:
    await cli.ok("pool", "create", "nb", "-c", "{gpu_memory_mb: 81920, gpu_share: 100}")
    await cli.ok("pool", "attach-policy", "nb", "team:nb")
    made = await cli.json(
        "request", "create", "-s", "team:nb", "--gpu-memory", "20GiB", "--gpu-share", "50"
    )
    assert made["status"] == "allocated"
    assert made["resources"]["gpu_memory_mb"] == 20480 and made["resources"]["gpu_share"] == 50
