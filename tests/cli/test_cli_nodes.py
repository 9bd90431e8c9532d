"""``respool node ...`` and the node views of ``pool``/``request``, against a live API: each
command's happy path, its table, ``-o json``, and one-line errors."""

from __future__ import annotations

from support.cli import Cli, failed
from support.placement import gpu_placement

GPUS_8 = "gpu=0,1,2,3,4,5,6,7"


def _row(table: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    return next(cells for line in table.splitlines() if (cells := line.split())[:1] == [first])


async def _boxes(cli: Cli) -> None:
    """Pool boxes backed by gpu-01 (8 named GPUs, A100) and gpu-02 (4 anonymous, H100), a
    policy for orchestrator:prod, and an abstract pool flat."""
    await cli.ok("pool", "create", "boxes")
    await cli.ok("pool", "create", "flat", "-c", "{gpu: 2}")
    await cli.ok("node", "add", "gpu-01", "--pool", "boxes", "-c", '{"mcpu": 64000}',
                 "--devices", GPUS_8, "--label", "gpu-type=A100-80G")  # fmt: skip
    await cli.ok("node", "add", "gpu-02", "--pool", "boxes", "-c", "{gpu: 4}",
                 "-l", "gpu-type=H100", "-l", "zone=eu-1")  # fmt: skip
    await cli.ok("pool", "attach-policy", "boxes", "orchestrator:prod")


async def test_add_list_describe(cli: Cli) -> None:
    await cli.ok("pool", "create", "boxes")
    added = await cli.api("node", "add", "gpu-01", "--pool", "boxes", "-c", '{"mcpu": 64000}',
                          "--devices", GPUS_8, "--label", "gpu-type=A100-80G")  # fmt: skip
    assert added.exit_code == 0 and "added node gpu-01 to pool boxes" in added.stderr
    await cli.ok("node", "add", "loose", "-c", "{tpu: 1}")
    nodes = await cli.json("node", "list")
    assert [n["name"] for n in nodes] == ["gpu-01", "loose"]
    node = nodes[0]
    assert (node["pool"], node["state"]) == ("boxes", "active")
    assert node["capacity"] == {"gpu": 8, "mcpu": 64000}
    assert node["devices"] == {"gpu": [str(i) for i in range(8)]}
    assert node["labels"] == {"gpu-type": "A100-80G"}
    assert nodes[1]["pool"] is None

    table = (await cli.ok("node", "list")).stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "POOL", "STATE", "GPU", "TPU", "MCPU", "LABELS"]
    assert _row(table, "gpu-01") == [
        "gpu-01",
        "boxes",
        "active",
        "0/8",
        "-",
        "0/64000",
        "gpu-type=A100-80G",
    ]
    assert _row(table, "loose") == ["loose", "-", "active", "-", "0/1", "-", "-"]

    assert [n["name"] for n in await cli.json("node", "list", "--pool", "boxes")] == ["gpu-01"]
    described = await cli.json("node", "describe", "gpu-01")
    assert described == node
    text = (await cli.ok("node", "describe", "gpu-01")).stdout
    assert "Devices" in text and "Allocations: none" in text
    devices = [line.split() for line in text.split("Devices")[1].splitlines() if "gpu" in line]
    assert devices == [["gpu", str(i), "-", "-"] for i in range(8)]


async def test_selector_picks_nodes_and_requests(cli: Cli) -> None:
    await _boxes(cli)
    listed = await cli.json("node", "list", "--selector", "gpu-type=H100")
    assert [n["name"] for n in listed] == ["gpu-02"]
    both = await cli.json("node", "list", "--selector", "gpu-type=H100", "--selector", "zone=eu-1")
    assert [n["name"] for n in both] == ["gpu-02"]
    assert await cli.json("node", "list", "--selector", "gpu-type=V100") == []
    by_name = await cli.json("node", "list", "--selector", "node=gpu-01")
    assert [n["name"] for n in by_name] == ["gpu-01"]

    req = await cli.json("request", "create", "-s", "orchestrator:prod", "--pool", "boxes",
                         "--gpu", "1", "--selector", "gpu-type=H100")  # fmt: skip
    assert req["status"] == "allocated" and req["node_selector"] == {"gpu-type": "H100"}
    assert req["placement"]["node"] == "gpu-02"
    on = await cli.json("request", "create", "-s", "orchestrator:prod", "--pool", "boxes",
                        "--gpu", "2", "--node", "gpu-01")  # fmt: skip
    assert on["node_selector"] == {"node": "gpu-01"}
    assert on["placement"] == gpu_placement("gpu-01", ["0", "1"], labels={"gpu-type": "A100-80G"})
    text = (await cli.ok("request", "describe", on["id"])).stdout
    assert "node gpu-01, devices gpu=0,1" in text and "node=gpu-01" in text

    # no node could ever hold it: rejected at once, exit 1
    never = await cli.api("request", "create", "-s", "orchestrator:prod", "--pool", "boxes",
                          "--gpu", "1", "--selector", "gpu-type=V100", "-o", "json")  # fmt: skip
    assert never.exit_code == 1 and "no_fitting_node" in never.stdout

    err = failed(await cli.api("request", "create", "-s", "x", "--node", "a",
                               "--selector", "node=b"), code=2)  # fmt: skip
    assert "--selector" in err and "node" in err
    assert "KEY=VALUE" in failed(
        await cli.api("request", "create", "-s", "x", "--selector", "novalue"), code=2
    )


async def test_describe_shows_who_holds_each_device(cli: Cli) -> None:
    await _boxes(cli)
    req = await cli.json("request", "create", "-s", "orchestrator:prod", "--pool", "boxes",
                         "--gpu", "3", "--node", "gpu-01")  # fmt: skip
    node = await cli.json("node", "describe", "gpu-01")
    assert node["usage"]["gpu"] == 3
    assert [(a["request_id"], a["subject"], a["devices"]) for a in node["allocations"]] == [
        (req["id"], "orchestrator:prod", {"gpu": ["0", "1", "2"]})
    ]
    text = (await cli.ok("node", "describe", "gpu-01")).stdout
    rows = [line.split() for line in text.split("Devices")[1].split("Allocations")[0].splitlines()]
    held = {r[1]: r[2:] for r in rows if r and r[0] == "gpu"}
    assert held["0"] == held["1"] == held["2"] == [req["id"][:8], "orchestrator:prod"]
    assert held["3"] == ["-", "-"]
    assert req["id"][:8] in text.split("Allocations")[1] and "gpu=0,1,2" in text

    listed = (await cli.ok("node", "list")).stdout
    assert "3/8" in listed


async def test_pool_views_show_nodes(cli: Cli) -> None:
    await _boxes(cli)
    req = await cli.json("request", "create", "-s", "orchestrator:prod", "--pool", "boxes",
                         "--gpu", "2", "--node", "gpu-02")  # fmt: skip
    pools = {p["name"]: p for p in await cli.json("pool", "list")}
    assert (pools["boxes"]["nodes"], pools["flat"]["nodes"]) == (2, 0)
    assert pools["boxes"]["capacity"]["gpu"] == 12
    table = (await cli.ok("pool", "list")).stdout
    assert table.splitlines()[0].split()[:6] == ["NAME", "ID", "USED", "/", "TOTAL", "NODES"]
    assert _row(table, "boxes")[5] == "2" and _row(table, "flat")[5] == "-"

    described = await cli.json("pool", "describe", "boxes")
    assert [n["name"] for n in described["nodes"]] == ["gpu-01", "gpu-02"]
    assert [r["placement"]["node"] for r in described["active"]] == ["gpu-02"]
    text = (await cli.ok("pool", "describe", "boxes")).stdout
    assert "Nodes (2)" in text and "Running on its nodes (1)" in text
    running = text.split("Running on its nodes")[1]
    assert "gpu-02" in running and req["id"][:8] in running
    assert (await cli.json("pool", "describe", "flat"))["nodes"] == []
    assert "Nodes (" not in (await cli.ok("pool", "describe", "flat")).stdout


async def test_pool_placement_option(cli: Cli) -> None:
    assert (await cli.json("pool", "create", "sp", "--placement", "spread"))[
        "placement"
    ] == "spread"
    assert (await cli.json("pool", "update", "sp", "--placement", "pack"))["placement"] == "pack"
    assert "--placement" in failed(await cli.api("pool", "create", "x", "--placement", "x"), code=2)
    # a pool with nodes has no capacity of its own
    await cli.ok("node", "add", "n1", "--pool", "sp", "-c", "{gpu: 1}")
    assert "nodes" in failed(await cli.api("pool", "update", "sp", "-c", "{gpu: 4}"))


async def test_label(cli: Cli) -> None:
    await _boxes(cli)
    node = await cli.json("node", "label", "gpu-01", "zone=eu-1", "rack=r7")
    assert node["labels"] == {"gpu-type": "A100-80G", "zone": "eu-1", "rack": "r7"}
    err = failed(await cli.api("node", "label", "gpu-01", "zone=eu-2"))
    assert "'zone'" in err and "eu-1" in err and "--overwrite" in err
    node = await cli.json("node", "label", "gpu-01", "zone=eu-2", "--overwrite", "rack-")
    assert node["labels"] == {"gpu-type": "A100-80G", "zone": "eu-2"}
    same = await cli.ok("node", "label", "gpu-01", "zone=eu-2")  # the same value: nothing to do
    assert "already has these labels" in same.stderr

    # pool=P moves the node (gpuctl's pool label); pool- takes it out of its pool
    await cli.ok("pool", "create", "other")
    assert "--overwrite" in failed(await cli.api("node", "label", "gpu-02", "pool=other"))
    moved = await cli.json("node", "label", "gpu-02", "pool=other", "--overwrite")
    assert moved["pool"] == "other" and "pool" not in moved["labels"]
    assert (await cli.json("pool", "describe", "other"))["pool"]["capacity"] == {"gpu": 4}
    assert (await cli.json("node", "label", "gpu-02", "pool-"))["pool"] is None

    # a busy node moves only with --force, which preempts what it holds
    req = await cli.json("request", "create", "-s", "orchestrator:prod", "--pool", "boxes",
                         "--gpu", "1", "--node", "gpu-01")  # fmt: skip
    err = failed(await cli.api("node", "label", "gpu-01", "pool-"))
    assert "force" in err
    await cli.ok("node", "label", "gpu-01", "pool-", "--force")
    after = await cli.json("request", "describe", req["id"])
    assert (after["status"], after["reason"]) == ("preempted", "node_removed")

    assert "label" in failed(await cli.api("node", "label", "gpu-01", "Bad Key=x"))
    assert "node" in failed(await cli.api("node", "label", "gpu-01", "node=x"))
    assert "KEY=VALUE" in failed(await cli.api("node", "label", "gpu-01", "novalue"), code=2)
    assert "not found" in failed(await cli.api("node", "label", "ghost", "a=b"))


async def test_cordon_uncordon_drain(cli: Cli) -> None:
    await _boxes(cli)
    cordoned = await cli.api("node", "cordon", "gpu-02", "-o", "json")
    assert cordoned.exit_code == 0 and "node gpu-02 is cordoned" in cordoned.stderr
    # a cordoned node takes no new grant: the request waits
    waiting = await cli.json("request", "create", "-s", "orchestrator:prod", "--pool", "boxes",
                             "--gpu", "1", "--node", "gpu-02")  # fmt: skip
    assert waiting["status"] == "queued"
    assert "cordoned" in (await cli.ok("node", "list")).stdout
    assert (await cli.json("node", "uncordon", "gpu-02"))["state"] == "active"
    assert (await cli.json("request", "describe", waiting["id"]))["status"] == "allocated"
    assert (await cli.json("node", "drain", "gpu-02"))["state"] == "draining"
    assert "not found" in failed(await cli.api("node", "drain", "ghost"))


async def test_delete(cli: Cli) -> None:
    await _boxes(cli)
    no = await cli.api("node", "delete", "gpu-02", input="n\n")
    assert no.exit_code == 1 and "Delete node gpu-02 from pool boxes?" in no.stderr
    assert (await cli.json("node", "describe", "gpu-02"))["name"] == "gpu-02"

    req = await cli.json("request", "create", "-s", "orchestrator:prod", "--pool", "boxes",
                         "--gpu", "1", "--node", "gpu-02")  # fmt: skip
    err = failed(await cli.api("node", "delete", "gpu-02", "-y"))
    assert "--force" in err or "force" in err
    deleted = await cli.api("node", "delete", "gpu-02", "-y", "--force")
    assert deleted.exit_code == 0 and "deleted node gpu-02" in deleted.stderr
    assert (await cli.json("request", "describe", req["id"]))["reason"] == "node_removed"
    assert [n["name"] for n in await cli.json("node", "list")] == ["gpu-01"]
    assert (await cli.json("pool", "describe", "boxes"))["pool"]["capacity"]["gpu"] == 8
    assert "not found" in failed(await cli.api("node", "delete", "gpu-02", "-y"))


async def test_add_errors(cli: Cli) -> None:
    assert "not found" in failed(await cli.api("node", "describe", "ghost"))
    assert "--devices" in failed(await cli.api("node", "add", "a", "--devices", "gpu"), code=2)
    err = failed(await cli.api("node", "add", "a", "--devices", "gpu=0,0"), code=2)
    assert "--devices" in err and "listed twice" in err
    assert "--devices" in failed(await cli.api("node", "add", "a", "--devices", "gpu=0,,1"), code=2)
    assert "-c" in failed(await cli.api("node", "add", "a"), code=2)
    err = failed(await cli.api("node", "add", "a", "-c", "{gpu: 3}", "--devices", "gpu=0,1"), 2)
    assert err.startswith("--devices")
    bad_name = failed(await cli.api("node", "add", "Bad Name", "-c", "{gpu: 1}"), code=2)
    assert bad_name.startswith("NAME")
    assert "--label" in failed(
        await cli.api("node", "add", "a", "-c", "{gpu: 1}", "--label", "Bad Key=x"), code=2
    )
    assert "not found" in failed(
        await cli.api("node", "add", "a", "-c", "{gpu: 1}", "--pool", "no")
    )
    await cli.ok("node", "add", "a", "-c", "{gpu: 1}")
    assert "already exists" in failed(await cli.api("node", "add", "a", "-c", "{gpu: 1}"))
    assert await cli.json("node", "list") != []
