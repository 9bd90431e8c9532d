"""``respool request create --count N``: one batch (SPEC §11.5), in queue order."""

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
