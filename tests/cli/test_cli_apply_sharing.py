"""Manifests with shared devices (docs/placement.md, "Sharing a GPU"; docs/cli.md, apply and
export): a node's sharing fields are applied, exported without the derived slice counters, and
an exported file applies back to no change; a changed mode is one update."""

from __future__ import annotations

from pathlib import Path

from support.cli import Cli

SHARED = """
pools:
  - name: boxes
    policies:
      - subject: team
nodes:
  - name: gpu-01
    pool: boxes
    devices: {gpu: ["0", "1"]}
    sharing: {gpu: mps}
    device_memory_mb: {gpu: 81920}
    reserved_memory_mb: {gpu: 512}
"""


async def test_apply_and_export_round_trip_a_shared_node(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(SHARED)
    plan = await cli.json("apply", "-f", str(path))
    assert plan["applied"] is True
    node = await cli.json("node", "describe", "gpu-01")
    assert node["sharing"] == {"gpu": "mps"} and node["reserved_memory_mb"] == {"gpu": 512}
    assert node["capacity"] == {"gpu": 2, "gpu_memory_mb": 2 * 81408, "gpu_share": 200}

    exported = (await cli.ok("export")).stdout
    assert "sharing:" in exported and "device_memory_mb:" in exported
    assert "gpu_memory_mb" not in exported  # derived from the devices, not part of the spec
    again = await cli.json("apply", "-f", "-", "--dry-run", input=exported)
    assert again["changes"] == []

    path.write_text(SHARED.replace("sharing: {gpu: mps}", "sharing: {gpu: time-slicing}"))
    changed = await cli.json("apply", "-f", str(path))
    fields = [f["field"] for c in changed["changes"] for f in c["fields"]]
    assert fields == ["sharing.gpu"]
    assert (await cli.json("node", "describe", "gpu-01"))["sharing"] == {"gpu": "time-slicing"}
