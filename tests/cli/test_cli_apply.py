"""``respool apply`` / ``export``: declarative pools, idempotence, dry-run consequences, prune."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from support.cli import Cli, failed

MANIFEST = """
pools:
  - name: gpus
    description: Shared training GPUs
    capacity: {gpu: 8, step_run: 32}
    queueing: strict
    preemption_grace_seconds: 0
    policies:
      - subject: orchestrator:prod
        priority: 10
        reserved: {gpu: 4}
        limit: {gpu: 8}
      - subject: orchestrator:dev
        limit: {gpu: 6, step_run: 4}
  - name: licences
    capacity: {licence_x: 3, tpu: 0}  # a zero is the same as leaving the key out
    policies:
      - subject: orchestrator:prod
"""


def _write(tmp_path: Path, text: str, name: str = "pools.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


async def _apply_new(cli: Cli, tmp_path: Path, text: str) -> tuple[str, Any]:
    """Writes ``text`` to a manifest and applies it: (the manifest's path, the plan applied)."""
    path = _write(tmp_path, text)
    plan = await cli.json("apply", "-f", path)
    assert plan["applied"] is True
    return path, plan


async def _assert_applied_again_changes_nothing(cli: Cli, path: str) -> None:
    """Applying the manifest at ``path`` again changes nothing, and the table says so."""
    again = await cli.json("apply", "-f", path)
    assert again["changes"] == [] and again["applied"] is False
    assert "No changes" in (await cli.ok("apply", "-f", path)).stdout


def _changes(plan: dict[str, object]) -> list[Any]:
    """The plan's list of changes."""
    changes = plan["changes"]
    assert isinstance(changes, list)
    return changes


def _summary(plan: dict[str, object]) -> list[tuple[str, str, str]]:
    return [
        (c["action"], c["kind"], c["pool"] + (f"/{c['subject']}" if c.get("subject") else ""))
        for c in _changes(plan)
    ]


async def test_apply_is_idempotent(cli: Cli, tmp_path: Path) -> None:
    path, plan = await _apply_new(cli, tmp_path, MANIFEST)
    assert plan["dry_run"] is False
    assert _summary(plan) == [
        ("create", "pool", "gpus"),
        ("create", "policy", "gpus/orchestrator:prod"),
        ("create", "policy", "gpus/orchestrator:dev"),
        ("create", "pool", "licences"),
        ("create", "policy", "licences/orchestrator:prod"),
    ]
    pool = (await cli.json("pool", "describe", "gpus"))["pool"]
    assert pool["capacity"] == {"gpu": 8, "step_run": 32}
    assert (pool["queueing"], pool["description"]) == ("strict", "Shared training GPUs")
    policies = {p["subject"]: p for p in await cli.json("pool", "list-policies", "gpus")}
    assert policies["orchestrator:prod"]["reserved"] == {"gpu": 4}
    assert policies["orchestrator:dev"]["limit"] == {"gpu": 6, "step_run": 4}

    await _assert_applied_again_changes_nothing(cli, path)

    # a field diff: one key changed, one removed, one scalar
    changed = MANIFEST.replace("limit: {gpu: 6, step_run: 4}", "limit: {gpu: 5}").replace(
        "queueing: strict", "queueing: best_effort"
    )
    plan = await cli.json("apply", "-f", _write(tmp_path, changed, "v2.yaml"), "--dry-run")
    fields = {
        (c["kind"], c["pool"], f["field"]): (f["old"], f["new"])
        for c in plan["changes"]
        for f in c["fields"]
    }
    assert fields == {
        ("pool", "gpus", "queueing"): ("strict", "best_effort"),
        ("policy", "gpus", "limit.gpu"): (6, 5),
        ("policy", "gpus", "limit.step_run"): (4, None),
    }
    text = (await cli.ok("apply", "-f", _write(tmp_path, changed, "v2.yaml"), "--dry-run")).stdout
    assert "~ policy gpus/orchestrator:dev" in text and "limit.gpu: 6 → 5" in text
    assert "Plan: 0 to create, 2 to update, 0 to delete." in text


async def test_apply_orders_changes_for_the_engine(cli: Cli, tmp_path: Path) -> None:
    """Shrink a pool while moving reserved units between subjects: the lowered reservation
    must go first and the raised one last, or the engine refuses (reserved sum > capacity)."""
    await cli.ok("apply", "-f", _write(tmp_path, MANIFEST))
    moved = (
        MANIFEST.replace("capacity: {gpu: 8, step_run: 32}", "capacity: {gpu: 3, step_run: 32}")
        .replace("reserved: {gpu: 4}", "reserved: {gpu: 1}")
        .replace("limit: {gpu: 6, step_run: 4}", "reserved: {gpu: 2}\n        limit: {gpu: 3}")
        .replace("limit: {gpu: 8}", "limit: {gpu: 3}")
    )
    plan = await cli.json("apply", "-f", _write(tmp_path, moved, "moved.yaml"))
    assert plan["applied"] is True
    policies = {p["subject"]: p for p in await cli.json("pool", "list-policies", "gpus")}
    assert policies["orchestrator:prod"]["reserved"] == {"gpu": 1}
    assert policies["orchestrator:dev"]["reserved"] == {"gpu": 2}
    assert policies["orchestrator:dev"]["limit"] == {"gpu": 3}
    assert (await cli.json("pool", "describe", "gpus"))["pool"]["capacity"]["gpu"] == 3
    assert (await cli.json("apply", "-f", _write(tmp_path, moved, "moved.yaml")))["changes"] == []


async def test_dry_run_shows_preemptions_and_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, MANIFEST))
    held = await cli.json("request", "create", "-s", "orchestrator:dev", "--gpu", "6")
    mine = await cli.json("request", "create", "-s", "orchestrator:prod", "--gpu", "2")
    big = await cli.json("request", "create", "-s", "orchestrator:prod", "--gpu", "8")
    assert (held["status"], mine["status"], big["status"]) == ("allocated", "allocated", "queued")
    before = await cli.json("pool", "describe", "gpus")
    events_before = await cli.json("request", "events", held["id"])

    shrunk = MANIFEST.replace(
        "capacity: {gpu: 8, step_run: 32}", "capacity: {gpu: 5, step_run: 32}"
    )
    shrunk = shrunk.replace("limit: {gpu: 8}", "limit: {gpu: 5}")
    path = _write(tmp_path, shrunk, "shrunk.yaml")
    plan = await cli.json("apply", "-f", path, "--dry-run")
    assert plan["dry_run"] is True and plan["applied"] is False
    assert _summary(plan) == [
        ("update", "pool", "gpus"),
        ("update", "policy", "gpus/orchestrator:prod"),
    ]
    effects = {c["request_id"]: c for c in plan["consequences"]}
    # the borrower above the new capacity is preempted; the 8-GPU request can never fit any more
    assert effects[held["id"]]["from_status"] == "allocated"
    assert effects[held["id"]]["to_status"] == "preempted"
    assert effects[big["id"]]["to_status"] == "rejected"
    assert mine["id"] not in effects  # in its reserved share: untouched

    table = (await cli.ok("apply", "-f", path, "--dry-run")).stdout
    assert "capacity.gpu: 8 → 5" in table
    assert "would be affected" in table and "rolled back" in table
    assert "allocated → preempted" in table and "queued → rejected" in table

    # nothing changed
    after = await cli.json("pool", "describe", "gpus")
    assert after["pool"]["capacity"] == before["pool"]["capacity"] == {"gpu": 8, "step_run": 32}
    assert after["pool"]["updated_at"] == before["pool"]["updated_at"]
    assert [r["id"] for r in after["active"]] == [r["id"] for r in before["active"]]
    assert [r["id"] for r in after["queue"]] == [big["id"]]
    assert await cli.json("request", "events", held["id"]) == events_before
    assert (await cli.json("pool", "list-policies", "gpus")) == before["policies"]

    # applying it for real does what the plan said
    applied = await cli.json("apply", "-f", path)
    assert {c["request_id"]: c["to_status"] for c in applied["consequences"]} == {
        held["id"]: "preempted",
        big["id"]: "rejected",
    }
    assert (await cli.json("request", "describe", held["id"]))["status"] == "preempted"


async def test_export_then_dry_run_is_empty(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, MANIFEST))
    await cli.ok("pool", "create", "extra", "-c", "{mcpu: 4000}", "--grace", "30", "-d", "it's")
    await cli.ok("pool", "attach-policy", "extra", "team:a", "-l", "{step_run: 2}", "-p", "-3")
    exported = (await cli.ok("export")).stdout
    assert "name: extra" in exported and "preemption_grace_seconds: 30" in exported
    assert "queueing: best_effort" not in exported  # defaults are left out
    assert "starvation_seconds" not in exported  # 300, the default, too

    plan = await cli.json("apply", "-f", "-", "--dry-run", "--prune", input=exported)
    assert plan["changes"] == [] and plan["consequences"] == []
    text = await cli.ok("apply", "-f", "-", "--dry-run", input=exported)
    assert "No changes" in text.stdout

    as_json = (await cli.ok("export", "-o", "json")).stdout
    assert {p["name"] for p in json.loads(as_json)["pools"]} == {"extra", "gpus", "licences"}
    plan = await cli.json("apply", "-f", "-", "--dry-run", "--prune", input=as_json)
    assert plan["changes"] == []


async def test_prune_asks_unless_yes(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, MANIFEST))
    only_gpus = MANIFEST.split("  - name: licences")[0]
    only_gpus = only_gpus.replace(
        "      - subject: orchestrator:dev\n        limit: {gpu: 6, step_run: 4}\n", ""
    )
    path = _write(tmp_path, only_gpus, "gpus.yaml")

    without = await cli.json("apply", "-f", path)  # no --prune: nothing is deleted
    assert without["changes"] == []

    refused = await cli.api("apply", "-f", path, "--prune", input="n\n")
    assert refused.exit_code == 1 and refused.stdout.strip() == "n"  # the runner echoes input
    assert "- pool licences" in refused.stderr and "Delete 1 pools and 2 policies" in refused.stderr
    assert len(await cli.json("pool", "list")) == 2

    plan = await cli.json("apply", "-f", path, "--prune", "--yes")
    assert sorted(_summary(plan)) == [
        ("delete", "policy", "gpus/orchestrator:dev"),
        ("delete", "policy", "licences/orchestrator:prod"),
        ("delete", "pool", "licences"),
    ]
    assert [p["name"] for p in await cli.json("pool", "list")] == ["gpus"]


async def test_prune_of_a_busy_pool_needs_force(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, MANIFEST))
    req = await cli.json("request", "create", "-s", "orchestrator:prod", "--pool", "licences",
                         "-r", "licence_x=1")  # fmt: skip
    assert req["status"] == "allocated"
    path = _write(tmp_path, MANIFEST.split("  - name: licences")[0], "gpus.yaml")
    err = failed(await cli.api("apply", "-f", path, "--prune", "--yes"))
    assert "licences" in err and "force" in err
    plan = await cli.json("apply", "-f", path, "--prune", "--yes", "--force")
    assert [c["to_status"] for c in plan["consequences"]] == ["cancelled"]


async def test_apply_errors(cli: Cli, tmp_path: Path) -> None:
    missing = failed(await cli.api("apply", "-f", str(tmp_path / "nope.yaml")))
    assert missing.startswith("cannot read") and "nope.yaml" in missing
    bad_yaml = failed(await cli.api("apply", "-f", _write(tmp_path, "pools: [\n  - {", "b.yaml")))
    assert "not valid YAML" in bad_yaml and "line" in bad_yaml
    unknown = failed(
        await cli.api("apply", "-f", _write(tmp_path, "pools:\n  - name: a\n    gpus: 1\n"))
    )
    assert "gpus" in unknown
    wrong_type = failed(
        await cli.api("apply", "-f", "-", input="pools:\n  - name: a\n    capacity: {gpu: x}\n")
    )
    assert "capacity" in wrong_type and "int" in wrong_type
    dup = failed(await cli.api("apply", "-f", "-", input="pools: [{name: a}, {name: a}]"))
    assert "named more than once: a" in dup
    assert "--file" in failed(await cli.api("apply"), code=2)

    # an engine error names the change, and the whole apply is rolled back
    broken = MANIFEST.replace("reserved: {gpu: 4}", "reserved: {gpu: 9}")
    err = failed(await cli.api("apply", "-f", _write(tmp_path, broken, "broken.yaml")))
    assert err.startswith("policy gpus/orchestrator:prod:")
    assert await cli.json("pool", "list") == []


async def test_apply_sets_and_resets_the_scheduling_fields(cli: Cli, tmp_path: Path) -> None:
    """A pool's scheduling fields (starvation_seconds, ordering) in a manifest: set, kept
    idempotent, exported, and back to their defaults when the file leaves them out."""
    fair = "pools:\n  - name: p\n    capacity: {gpu: 2}\n    starvation_seconds: null\n" \
        "    ordering: fair\n"  # fmt: skip
    await cli.json("apply", "-f", _write(tmp_path, fair))
    pool = (await cli.json("pool", "describe", "p"))["pool"]
    assert (pool["starvation_seconds"], pool["ordering"]) == (None, "fair")
    assert _summary(await cli.json("apply", "-f", _write(tmp_path, fair))) == []
    exported = (await cli.ok("export")).stdout
    assert "starvation_seconds: null" in exported and "ordering: fair" in exported
    plain = "pools:\n  - name: p\n    capacity: {gpu: 2}\n"
    plan = await cli.json("apply", "-f", _write(tmp_path, plain))
    assert _summary(plan) == [("update", "pool", "p")]
    pool = (await cli.json("pool", "describe", "p"))["pool"]
    assert (pool["starvation_seconds"], pool["ordering"]) == (300, "fifo")


NODES = """
pools:
  - name: boxes
    placement: spread
    policies:
      - subject: orchestrator:prod
        reserved: {gpu: 2}
nodes:
  - name: gpu-01
    pool: boxes
    labels: {gpu-type: A100-80G, zone: eu-1}
    capacity: {mcpu: 8000}
    devices: {gpu: ["0", "1", "2", "3"]}
  - name: gpu-02
    pool: boxes
    capacity: {gpu: 2}
  - name: spare
"""
SPARE = "  - name: spare\n"


def _nodes(plan: dict[str, object]) -> list[tuple[str, str]]:
    return [(c["action"], c["node"]) for c in _changes(plan) if c["kind"] == "node"]


async def test_apply_creates_nodes_and_is_idempotent(cli: Cli, tmp_path: Path) -> None:
    path, plan = await _apply_new(
        cli, tmp_path, NODES.replace(SPARE, SPARE + "    capacity: {mcpu: 1000}\n")
    )
    assert _summary(plan) == [
        ("create", "pool", "boxes"),
        ("create", "policy", "boxes/orchestrator:prod"),
        ("create", "node", "boxes"),
        ("create", "node", "boxes"),
        ("create", "node", ""),
    ]
    assert _nodes(plan) == [("create", "gpu-01"), ("create", "gpu-02"), ("create", "spare")]
    created = {f["field"]: f["new"] for f in plan["changes"][2]["fields"]}
    # a key listed in devices has as many units as ids
    assert created["capacity.gpu"] == 4 and created["devices.gpu"] == ["0", "1", "2", "3"]

    # the pool's capacity is its nodes' sum; its placement is the file's
    pool = (await cli.json("pool", "describe", "boxes"))["pool"]
    # (mcpu is listed by gpu-01 only: unbounded on gpu-02, so the pool does not bound it)
    assert pool["capacity"] == {"gpu": 6}
    assert (pool["placement"], pool["nodes"]) == ("spread", 2)
    node = await cli.json("node", "describe", "gpu-01")
    assert node["devices"] == {"gpu": ["0", "1", "2", "3"]}
    assert node["labels"] == {"gpu-type": "A100-80G", "zone": "eu-1"}
    assert (await cli.json("node", "describe", "spare"))["pool"] is None

    await _assert_applied_again_changes_nothing(cli, path)


async def test_export_writes_nodes_and_applies_back_to_nothing(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, NODES.replace(SPARE, "")))
    await cli.ok("node", "cordon", "gpu-02")
    exported = (await cli.ok("export")).stdout
    assert "nodes:" in exported and "name: gpu-01" in exported and "state: cordoned" in exported
    assert "placement: spread" in exported
    boxes = exported.split("name: boxes")[1].split("policies:")[0]
    assert "capacity" not in boxes  # a pool with nodes has no capacity of its own
    plan = await cli.json("apply", "-f", "-", "--dry-run", "--prune", input=exported)
    assert plan["changes"] == []

    # no node at all: export leaves `nodes:` out, and so the file leaves nodes alone
    await cli.ok("apply", "-f", "-", "--prune", "--yes", input="pools: []\nnodes: []\n")
    assert await cli.json("node", "list") == []
    assert "\nnodes:" not in (await cli.ok("export")).stdout


async def test_dry_run_plans_node_changes(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, NODES))
    changed = (
        NODES.replace("zone: eu-1", "zone: eu-2")
        .replace('devices: {gpu: ["0", "1", "2", "3"]}', 'devices: {gpu: ["0", "1"]}')
        .replace("    capacity: {gpu: 2}\n", "    capacity: {gpu: 2}\n    state: draining\n")
        .replace(SPARE, SPARE + "    pool: boxes\n    capacity: {tpu: 1}\n")
    )
    path = _write(tmp_path, changed, "v2.yaml")
    plan = await cli.json("apply", "-f", path, "--dry-run")
    fields = {
        (c["node"], f["field"]): (f["old"], f["new"])
        for c in plan["changes"]
        if c["kind"] == "node"
        for f in c["fields"]
    }
    assert fields == {
        ("gpu-01", "labels.zone"): ("eu-1", "eu-2"),
        ("gpu-01", "capacity.gpu"): (4, 2),
        ("gpu-01", "devices.gpu"): (["0", "1", "2", "3"], ["0", "1"]),
        ("gpu-02", "state"): ("active", "draining"),
        ("spare", "pool"): (None, "boxes"),
        ("spare", "capacity.tpu"): (None, 1),
    }
    text = (await cli.ok("apply", "-f", path, "--dry-run")).stdout
    assert "~ node gpu-01 (pool boxes)" in text and 'labels.zone: "eu-1" → "eu-2"' in text
    assert "~ node spare" in text and 'pool: (none) → "boxes"' in text
    # nothing changed
    assert (await cli.json("node", "describe", "gpu-01"))["labels"]["zone"] == "eu-1"
    assert (await cli.json("node", "describe", "spare"))["pool"] is None

    await cli.ok("apply", "-f", path)
    node = await cli.json("node", "describe", "gpu-01")
    assert node["devices"] == {"gpu": ["0", "1"]} and node["capacity"]["gpu"] == 2
    assert (await cli.json("node", "describe", "gpu-02"))["state"] == "draining"
    pool = (await cli.json("pool", "describe", "boxes"))["pool"]
    assert pool["capacity"] == {"gpu": 4, "tpu": 1} and pool["nodes"] == 3
    assert (await cli.json("apply", "-f", path))["changes"] == []

    # labels the file leaves out are removed: the file is the node's whole state
    plan = await cli.json("apply", "-f", _write(tmp_path, changed.replace(", zone: eu-2", "")))
    assert [f["field"] for c in plan["changes"] for f in c["fields"]] == ["labels.zone"]
    assert (await cli.json("node", "describe", "gpu-01"))["labels"] == {"gpu-type": "A100-80G"}


async def test_prune_deletes_nodes_only_when_the_file_has_nodes(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, NODES))
    pools_only = NODES.split("nodes:")[0]
    plan = await cli.json("apply", "-f", _write(tmp_path, pools_only, "p.yaml"), "--prune", "--yes")
    assert plan["changes"] == []  # no `nodes:`: nodes are not the file's business
    assert len(await cli.json("node", "list")) == 3

    without_spare = _write(tmp_path, NODES.replace(SPARE, ""), "n.yaml")
    refused = await cli.api("apply", "-f", without_spare, "--prune", input="n\n")
    assert refused.exit_code == 1
    assert "- node spare" in refused.stderr and "and 1 nodes" in refused.stderr
    plan = await cli.json("apply", "-f", without_spare, "--prune", "--yes")
    assert _nodes(plan) == [("delete", "spare")]
    assert [n["name"] for n in await cli.json("node", "list")] == ["gpu-01", "gpu-02"]


async def test_moving_a_busy_node_needs_force(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, NODES))
    req = await cli.json(
        "request", "create", "-s", "orchestrator:prod", "--gpu", "4", "--node", "gpu-01"
    )
    assert req["status"] == "allocated" and req["placement"]["node"] == "gpu-01"
    moved = _write(tmp_path, NODES.replace("    pool: boxes\n    labels", "    labels"), "m.yaml")
    err = failed(await cli.api("apply", "-f", moved))
    assert err.startswith("node gpu-01:") and "force" in err
    assert (await cli.json("node", "describe", "gpu-01"))["pool"] == "boxes"  # rolled back

    plan = await cli.json("apply", "-f", moved, "--dry-run", "--force")
    assert {c["request_id"]: c["reason"] for c in plan["consequences"]} == {
        req["id"]: "node_removed"
    }
    plan = await cli.json("apply", "-f", moved, "--force")
    assert (await cli.json("request", "describe", req["id"]))["status"] == "preempted"
    assert (await cli.json("node", "describe", "gpu-01"))["pool"] is None


async def test_apply_node_errors(cli: Cli, tmp_path: Path) -> None:
    dup = failed(await cli.api("apply", "-f", "-", input="nodes: [{name: a}, {name: a}]"))
    assert "nodes named more than once: a" in dup
    unknown = failed(await cli.api("apply", "-f", "-", input="nodes: [{name: a, gpus: 1}]"))
    assert "gpus" in unknown
    bad_label = "nodes:\n  - name: a\n    capacity: {gpu: 1}\n    labels: {Bad Key: x}\n"
    err = failed(await cli.api("apply", "-f", "-", input=bad_label))
    assert err.startswith("node a:") and "label" in err
    mismatch = "nodes:\n  - name: a\n    capacity: {gpu: 3}\n    devices: {gpu: ['0', '1']}\n"
    err = failed(await cli.api("apply", "-f", "-", input=mismatch))
    assert err.startswith("node a:") and "devices.gpu" in err
    assert await cli.json("node", "list") == []


async def test_an_abstract_pool_becomes_a_pool_of_nodes(cli: Cli, tmp_path: Path) -> None:
    """The file drops the pool's own capacity and lists a node in it: the hand-set capacity is
    cleared before the node joins, and the pool's capacity becomes the node's."""
    await cli.ok("apply", "-f", _write(tmp_path, "pools:\n  - name: p\n    capacity: {gpu: 8}\n"))
    nodes = "pools:\n  - name: p\nnodes:\n  - name: n1\n    pool: p\n    capacity: {gpu: 4}\n"
    plan = await cli.json("apply", "-f", _write(tmp_path, nodes, "nodes.yaml"))
    assert _summary(plan) == [("update", "pool", "p"), ("create", "node", "p")]
    pool = (await cli.json("pool", "describe", "p"))["pool"]
    assert (pool["capacity"], pool["nodes"]) == ({"gpu": 4}, 1)
    assert (await cli.json("apply", "-f", _write(tmp_path, nodes, "nodes.yaml")))["changes"] == []


SHAPES = """
pools:
  - name: shaped
    capacity: {gpu: 8}
    policies:
      - subject: prod
        reserved: {gpu: 4}
        priority_lane: true
        windows:
          - {timezone: Europe/Berlin, days: [mon, tue, wed, thu, fri], from: "09:00", to: 17:00}
          - {start: "2026-12-24T00:00:00Z", end: 2026-12-27T00:00:00Z}
      - subject: "team-vision:*"
        limit: {gpu: 4}
        windows:
          - {timezone: UTC, from: "22:00", to: "06:00"}
      - subject: research
        reserved: {gpu: 2}
"""


def _fields(plan: dict[str, Any]) -> dict[tuple[str, str], tuple[object, object]]:
    return {
        (f"{c['pool']}/{c.get('subject')}", f["field"]): (f["old"], f["new"])
        for c in plan["changes"]
        for f in c["fields"]
    }


async def test_apply_sets_lanes_and_windows_and_export_round_trips(
    cli: Cli, tmp_path: Path
) -> None:
    plan = await cli.json("apply", "-f", _write(tmp_path, SHAPES))
    fields = _fields(plan)
    assert fields[("shaped/prod", "priority_lane")] == (False, True)
    assert fields[("shaped/team-vision:*", "windows")][1] == [
        {"timezone": "UTC", "from": "22:00", "to": "06:00"}
    ]
    assert ("shaped/research", "windows") not in fields  # no windows: nothing to set
    policies = {p["subject"]: p for p in await cli.json("pool", "list-policies", "shaped")}
    prod = policies["prod"]
    assert prod["priority_lane"] is True and len(prod["windows"]) == 2
    assert prod["windows"][0]["days"] == ["mon", "tue", "wed", "thu", "fri"]
    assert prod["windows"][0]["to"] == "17:00"  # unquoted 17:00 in YAML is still a time
    assert datetime.fromisoformat(prod["windows"][1]["end"]) == datetime(2026, 12, 27, tzinfo=UTC)
    assert policies["team-vision:*"]["windows"][0]["timezone"] == "UTC"
    assert (
        policies["research"]["windows"] is None and policies["research"]["priority_lane"] is False
    )

    # The same file again, and the export of what it made, change nothing.
    assert (await cli.json("apply", "-f", _write(tmp_path, SHAPES)))["changes"] == []
    exported = (await cli.ok("export")).stdout
    assert "priority_lane: true" in exported and "windows:" in exported
    assert exported.count("priority_lane") == 1  # written only when set
    doc = yaml.safe_load(exported)
    research = next(p for p in doc["pools"][0]["policies"] if p["subject"] == "research")
    assert "windows" not in research and "priority_lane" not in research
    plan = await cli.json("apply", "-f", "-", "--dry-run", "--prune", input=exported)
    assert plan["changes"] == []
    as_json = (await cli.ok("export", "-o", "json")).stdout
    assert (await cli.json("apply", "-f", "-", "--prune", input=as_json))["changes"] == []


async def test_dry_run_shows_window_and_lane_changes(cli: Cli, tmp_path: Path) -> None:
    await cli.ok("apply", "-f", _write(tmp_path, SHAPES))
    changed = SHAPES.replace("priority_lane: true", "priority_lane: false").replace(
        '{start: "2026-12-24T00:00:00Z", end: 2026-12-27T00:00:00Z}',
        "{timezone: UTC, days: [sat, sun], from: '10:00', to: '12:00'}",
    )
    # research gets a window; team-vision's windows go (always in force)
    changed = changed.replace(
        "      - subject: research\n",
        "      - subject: research\n"
        "        windows: [{timezone: UTC, from: '00:00', to: '08:00'}]\n",
    ).replace('        windows:\n          - {timezone: UTC, from: "22:00", to: "06:00"}\n', "")
    path = _write(tmp_path, changed, "v2.yaml")
    text = (await cli.ok("apply", "-f", path, "--dry-run")).stdout
    assert "~ policy shaped/prod" in text
    assert "priority_lane: true → false" in text
    assert "windows: +sat,sun 10:00-12:00 UTC, -2026-12-24T00:00Z/2026-12-27T00:00Z" in text
    assert "windows: 22:00-06:00 UTC → always" in text  # team-vision:*
    assert "windows: always → 00:00-08:00 UTC" in text  # research
    # a dry run changes nothing
    policies = {p["subject"]: p for p in await cli.json("pool", "list-policies", "shaped")}
    assert policies["prod"]["priority_lane"] is True and policies["research"]["windows"] is None

    plan = await cli.json("apply", "-f", path)
    assert {c["subject"] for c in plan["changes"]} == {"prod", "team-vision:*", "research"}
    policies = {p["subject"]: p for p in await cli.json("pool", "list-policies", "shaped")}
    assert policies["prod"]["priority_lane"] is False
    assert [w.get("days") for w in policies["prod"]["windows"]] == [
        ["mon", "tue", "wed", "thu", "fri"],
        ["sat", "sun"],
    ]
    assert policies["team-vision:*"]["windows"] is None
    assert policies["research"]["windows"][0]["to"] == "08:00"
    assert (await cli.json("apply", "-f", path))["changes"] == []


async def test_apply_window_errors_name_the_field(cli: Cli, tmp_path: Path) -> None:
    naive = SHAPES.replace('"2026-12-24T00:00:00Z"', '"2026-12-24T00:00:00"')
    err = failed(await cli.api("apply", "-f", _write(tmp_path, naive, "naive.yaml")))
    assert "pools[0].policies[0].windows[1].start" in err and "zone" in err
    bad_day = SHAPES.replace("days: [mon, tue", "days: [monday, tue")
    err = failed(await cli.api("apply", "-f", _write(tmp_path, bad_day, "day.yaml")))
    assert "windows[0].days" in err
    zone = SHAPES.replace("timezone: Europe/Berlin", "timezone: Mars/Base")
    err = failed(await cli.api("apply", "-f", _write(tmp_path, zone, "zone.yaml")))
    assert "Mars/Base" in err or "timezone" in err
    assert await cli.json("pool", "list") == []  # the whole apply was rolled back
    # The API refuses such an instant too, naming the field.
    doc = yaml.safe_load(naive.replace("to: 17:00", 'to: "17:00"'))
    async with httpx.AsyncClient(base_url=cli.url) as http:
        body = json.dumps(doc, default=datetime.isoformat)
        answer = await http.post(
            "/v1/apply", content=body, headers={"content-type": "application/json"}
        )
    assert answer.status_code == 400
    assert answer.json()["field"] == "pools[0].policies[0].windows[1].start"
