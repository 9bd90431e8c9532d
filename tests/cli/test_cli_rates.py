"""``respool pool create/update --rate KEY=AMOUNT/WINDOW``, and rate keys shown as USED/AMOUNT per
window with the next refill in ``pool list`` and ``pool describe`` (docs/rates.md)."""

from __future__ import annotations

from pathlib import Path

from support.cli import Cli, failed


async def test_rate_keys_in_the_pool_commands(cli: Cli) -> None:
    pool = await cli.json(
        "pool", "create", "llm", "-c", '{"gpu": 2}', "--rate", "llm_tokens=20000/1m",
        "--rate", "llm_requests=50/60",
    )  # fmt: skip
    assert pool["capacity"] == {"gpu": 2}
    assert pool["rates"]["llm_tokens"]["amount"] == 20000
    assert pool["rates"]["llm_tokens"]["per_seconds"] == 60
    assert pool["rates"]["llm_requests"]["per_seconds"] == 60
    await cli.ok("pool", "attach-policy", "llm", "team:nlp")
    await cli.ok(
        "request", "create", "-s", "team:nlp", "--pool", "llm",
        "-r", "llm_tokens=4000", "-r", "llm_requests=1",
    )  # fmt: skip
    listed = (await cli.ok("pool", "list")).stdout
    assert "llm_tokens/1m" in listed and "4000/20000" in listed and "1/50" in listed
    described = (await cli.ok("pool", "describe", "llm")).stdout
    assert "llm_tokens/1m" in described and "NEXT REFILL" in described
    updated = await cli.json("pool", "update", "llm", "--rate", "llm_requests=off")
    assert list(updated["rates"]) == ["llm_tokens"]


async def test_bad_rate_options(cli: Cli) -> None:
    for bad in ("llm_tokens", "llm_tokens=5", "llm_tokens=x/60", "llm_tokens=5/0", "=5/60"):
        assert "--rate" in failed(await cli.api("pool", "create", "x", "--rate", bad), code=2)
    err = failed(await cli.api("pool", "create", "x", "--rate", "Bad=5/60"))
    assert "rates.Bad" in err or "Bad" in err


async def test_manifests_carry_rate_keys(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text(
        "pools:\n"
        "  - name: llm\n"
        "    rates: {llm_tokens: {amount: 2000000, per_seconds: 60}}\n"
        "    policies:\n"
        "      - subject: team-a:*\n"
        "        reserved: {llm_tokens: 500000}\n"
    )
    plan = await cli.json("apply", "-f", str(path))
    assert plan["applied"] is True
    pool = await cli.json("pool", "describe", "llm")
    assert pool["pool"]["rates"]["llm_tokens"]["amount"] == 2000000
    exported = (await cli.ok("export")).stdout
    assert "per_seconds: 60" in exported
    again = await cli.json("apply", "-f", "-", "--dry-run", "--prune", input=exported)
    assert again["changes"] == []
    path.write_text(path.read_text().replace("per_seconds: 60", "per_seconds: 30"))
    changed = await cli.json("apply", "-f", str(path))
    fields = [f for c in changed["changes"] for f in c["fields"]]
    assert fields == [
        {
            "field": "rates.llm_tokens",
            "old": {"amount": 2000000, "per_seconds": 60},
            "new": {"amount": 2000000, "per_seconds": 30},
        }
    ]
    pool = await cli.json("pool", "describe", "llm")
    assert pool["pool"]["rates"]["llm_tokens"]["per_seconds"] == 30
