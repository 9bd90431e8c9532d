"""``respool request create --count N``: one batch, in queue order (docs/scheduling.md)."""

from __future__ import annotations

import json

from support.cli import Cli, failed


async def test_create_count(cli: Cli) -> None:
    await cli.ok("pool", "create", "b", "-c", '{"gpu": 3}')
    await cli.ok("pool", "attach-policy", "b", "team:b")
    made = await cli.ok(
        "request", "create", "-s", "team:b", "--gpu", "1", "--count", "5",
        "--idempotency-key", "sweep", "-o", "json",
    )  # fmt: skip
    reqs = json.loads(made.stdout)
    assert [r["status"] for r in reqs] == ["allocated"] * 3 + ["queued"] * 2
    assert [r["idempotency_key"] for r in reqs] == [f"sweep-{i}" for i in range(5)]
    assert "5 requests: 3 allocated, 2 queued" in made.stderr
    again = await cli.json(
        "request", "create", "-s", "team:b", "--gpu", "1", "--count", "5",
        "--idempotency-key", "sweep",
    )  # fmt: skip
    assert [r["id"] for r in again] == [r["id"] for r in reqs]  # replayed, member by member
    # a rejected member: exit 1, the batch still shown
    big = await cli.api("request", "create", "-s", "team:b", "--gpu", "9", "--count", "2")
    assert big.exit_code == 1 and "2 rejected" in big.stderr
    assert "--wait" in failed(
        await cli.api("request", "create", "-s", "team:b", "--count", "2", "--wait", "1"), 2
    )


async def test_create_count_gang(cli: Cli) -> None:
    await cli.ok("pool", "create", "g", "-c", '{"gpu": 4}')
    await cli.ok("pool", "attach-policy", "g", "team:g")
    held = await cli.json("request", "create", "-s", "team:g", "--gpu", "2")
    made = await cli.ok(
        "request", "create", "-s", "team:g", "--gpu", "1", "--count", "3", "--gang", "-o", "json"
    )
    reqs = json.loads(made.stdout)
    gang_id = reqs[0]["gang_id"]
    assert [r["status"] for r in reqs] == ["queued"] * 3  # 3 do not fit in the 2 free: none
    assert f"gang {gang_id}: 3 requests: 3 queued" in made.stderr
    await cli.ok("request", "release", held["id"])
    members = await cli.json("request", "list", "--gang", gang_id)
    assert sorted(r["id"] for r in members) == sorted(r["id"] for r in reqs)
    assert {r["status"] for r in members} == {"allocated"}
    # the gang named by a prefix, as tables show ids
    short = await cli.json("request", "list", "--gang", gang_id[:8])
    assert sorted(r["id"] for r in short) == sorted(r["id"] for r in reqs)
    unknown = await cli.api("request", "list", "--gang", "ffffffff")
    assert unknown.exit_code != 0 and "no gang id starts with ffffffff" in unknown.stderr
    # --all-or-nothing is the same flag; a gang that can never fit is rejected whole: exit 1
    big = await cli.api(
        "request", "create", "-s", "team:g", "--gpu", "3", "--count", "2", "--all-or-nothing"
    )
    assert big.exit_code == 1 and "2 rejected" in big.stderr


async def test_dry_run_refuses_count_and_gang(cli: Cli) -> None:
    """A what-if answers for one request: asked for a batch or a gang, the CLI refuses rather
    than answer for one member what the real command would reject (4 x 3 GPUs on 8)."""
    await cli.ok("pool", "create", "w", "-c", '{"gpu": 8}')
    await cli.ok("pool", "attach-policy", "w", "team:w")
    real = ["request", "create", "-s", "team:w", "--gpu", "3"]
    for extra in (["--count", "4", "--gang"], ["--count", "4"], ["--gang"]):
        err = failed(await cli.api(*real, *extra, "--dry-run"), 2)
        assert "--dry-run" in err and ("--count" in err or "--gang" in err), err
    assert await cli.json("request", "list", "--pool", "w") == []  # nothing was created
    refused = await cli.api(*real, "--count", "4", "--gang")
    assert refused.exit_code == 1 and "4 rejected" in refused.stderr  # what it would have hidden
