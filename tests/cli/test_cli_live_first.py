"""What a Slurm or kubectl user expects of ``request list``, ``describe`` and ``events``:
live requests first (``--all`` for the finished ones), a NODE column, ``-s`` for the subject;
where a finished request ran; ``--memory`` in Kubernetes' spellings; ``create --wait`` that
says how it waits off a terminal and gives up in one line."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx

from support.cli import Cli, failed
from support.placement import gpu_placement


async def _box(cli: Cli, pool: str, node: str) -> None:
    """A pool backed by one 8-GPU node, and a policy for ``team:<pool>``."""
    await cli.ok("pool", "create", pool)
    await cli.ok(
        "node", "add", node, "--pool", pool, "-c", '{"gpu": 8}', "--devices",
        "gpu=0,1,2,3,4,5,6,7",
    )  # fmt: skip
    await cli.ok("pool", "attach-policy", pool, f"team:{pool}")


def _row(table: str, request_id: str) -> str:
    return next(line for line in table.splitlines() if request_id[:8] in line)


async def test_list_shows_live_requests_unless_all(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "live", "-c", '{"gpu": 2}')
    await cli.ok("pool", "attach-policy", "live", "team:live")
    done = await cli.json("request", "create", "-s", "team:live", "--gpu", "1")
    await cli.ok("request", "release", done["id"])
    held = await cli.json("request", "create", "-s", "team:live", "--gpu", "2")
    waits = await cli.json("request", "create", "-s", "team:live", "--gpu", "1")
    assert (held["status"], waits["status"]) == ("allocated", "queued")

    # by default, as squeue: what is queued or running, not what ended
    live = await cli.json("request", "list", "--pool", "live")
    assert [r["id"] for r in live] == [waits["id"], held["id"]]
    table = (await cli.ok("request", "list", "--pool", "live")).stdout
    assert done["id"][:8] not in table and held["id"][:8] in table

    # --all / -a: the finished ones too, newest first
    for flag in ("--all", "-a"):
        every = await cli.json("request", "list", "--pool", "live", flag)
        assert [r["id"] for r in every] == [waits["id"], held["id"], done["id"]]
    # --status still picks one status, finished ones included
    released = await cli.json("request", "list", "--pool", "live", "--status", "released")
    assert [r["id"] for r in released] == [done["id"]]
    # -s is --subject, as for request create
    mine = await cli.json("request", "list", "-s", "team:live", "-a")
    assert {r["id"] for r in mine} == {done["id"], held["id"], waits["id"]}
    assert await cli.json("request", "list", "-s", "team:nobody", "-a") == []

    # the same filter for any API client: status=live
    async with httpx.AsyncClient(base_url=cli.url) as client:
        page = await client.get("/v1/requests", params={"pool": "live", "status": "live"})
        assert page.status_code == 200
        assert [r["id"] for r in page.json()["items"]] == [waits["id"], held["id"]]
        bad = await client.get("/v1/requests", params={"status": "alive"})
        assert bad.status_code == 400 and "status" in bad.text


async def test_node_column_and_where_a_finished_request_ran(module_cli: Cli) -> None:
    cli = module_cli
    await _box(cli, "ranon", "ranon-1")
    first = await cli.json("request", "create", "-s", "team:ranon", "--gpu", "2")
    second = await cli.json("request", "create", "-s", "team:ranon", "--gpu", "3")
    assert first["placement"]["devices"] == {"gpu": ["0", "1"]}
    assert first.get("last_placement") is None  # while it holds: placement says where
    released = await cli.json("request", "release", first["id"])

    # placement keeps its meaning (null once it no longer holds); last_placement says where it ran
    assert released["placement"] is None
    assert released["last_placement"] == gpu_placement("ranon-1", ["0", "1"])
    again = await cli.json("request", "describe", first["id"])
    assert again["placement"] is None and again["last_placement"] == released["last_placement"]

    described = (await cli.ok("request", "describe", first["id"])).stdout
    assert "Ran on" in described and "node ranon-1, devices gpu=0,1" in described

    # the grant's event records where it was placed
    history = await cli.json("request", "events", first["id"])
    granted = next(e for e in history if e["to"] == "allocated")
    assert granted["placement"]["node"] == "ranon-1"
    assert granted["placement"]["devices"] == {"gpu": ["0", "1"]}
    assert all(e["placement"] is None for e in history if e["to"] != "allocated")
    events = (await cli.ok("request", "events", first["id"])).stdout
    assert "PLACED ON" in events.splitlines()[0]
    grant_row = next(line for line in events.splitlines() if " allocated " in f" {line} ")
    assert "ranon-1 gpu=0,1" in grant_row

    # NODE: where it runs, or ran; - in a pool without nodes
    table = (await cli.ok("request", "list", "--all", "-o", "wide")).stdout
    assert "NODE" in table.splitlines()[0].split()
    assert "ranon-1" in _row(table, first["id"]) and "ranon-1" in _row(table, second["id"])
    await cli.ok("pool", "create", "flat", "-c", '{"gpu": 1}')
    await cli.ok("pool", "attach-policy", "flat", "team:flat")
    flat = await cli.json("request", "create", "-s", "team:flat", "--gpu", "1")
    table = (await cli.ok("request", "list", "--pool", "flat", "-o", "wide")).stdout
    header = table.splitlines()[0].split()
    cells = _row(table, flat["id"]).split()
    assert cells[header.index("NODE")] == "-"
    flat_done = await cli.json("request", "release", flat["id"])
    assert flat_done["last_placement"] is None


async def test_memory_takes_kubernetes_suffixes(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "mem", "-c", '{"gpu": 1}')
    await cli.ok("pool", "attach-policy", "mem", "team:mem")
    for memory, mb in (("8G", 8000), ("8Gi", 8590), ("8GB", 8000), ("8GiB", 8590), ("512Mi", 537)):
        made = await cli.json("request", "create", "-s", "team:mem", "--memory", memory)
        assert made["resources"]["memory_mb"] == mb, memory
    refused = failed(await cli.api("request", "create", "-s", "team:mem", "--memory", "8g"), 2)
    assert refused.startswith('--memory: "8g" is not <number><unit>')

    # respool run sends the same settings, converted by the same server
    env = {**os.environ, "RESPOOL_URL": cli.url}
    env.pop("RESPOOL_TOKEN", None)
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "respool_client.run", "-s", "team:mem", "--memory", "8Gi", "--",
        sys.executable, "-c", "import os; print(os.environ['RESPOOL_RESOURCES'])",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(run.communicate(), 60)
    assert run.returncode == 0, err.decode()
    assert json.loads(out.decode().strip().splitlines()[-1])["memory_mb"] == 8590


async def test_wait_says_when_it_queues_and_when_it_is_granted(module_cli: Cli) -> None:
    cli = module_cli
    await cli.ok("pool", "create", "pipe", "-c", '{"gpu": 1}')
    await cli.ok("pool", "attach-policy", "pipe", "team:pipe")
    holder = await cli.json("request", "create", "-s", "team:pipe", "--gpu", "1")
    waiting = asyncio.create_task(
        cli.api("request", "create", "-s", "team:pipe", "--gpu", "1", "--wait", "30", "-o", "json")
    )
    async with httpx.AsyncClient(base_url=cli.url) as client:
        for _ in range(400):  # the waiter is queued behind the holder
            page = await client.get("/v1/requests", params={"pool": "pipe", "status": "queued"})
            if page.json()["items"]:
                break
            await asyncio.sleep(0.05)
        assert not waiting.done()
        await client.post(f"/v1/requests/{holder['id']}/release")
    result = await asyncio.wait_for(waiting, 30)
    assert result.exit_code == 0, result.stderr
    final = json.loads(result.stdout)  # stdout: the result only
    assert final["status"] == "allocated"
    lines = result.stderr.splitlines()
    # the runner's stderr is not a terminal: plain lines, the queued one first
    assert lines[0].startswith(f"request {final['id']}: queued #1 in the queue of pipe")
    assert "waiting up to 30s" in lines[0]
    assert lines[-1] == f"request {final['id']}: allocated in pool pipe"
