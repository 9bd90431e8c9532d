"""User mistakes: one ``error:`` line naming the flag as the user typed it and a pool by its
name, never "internal error" nor an id the user did not give; exit code 2 for a malformed
value (found by the CLI or refused by the API), 1 for the rest (not found, conflicts)."""

from __future__ import annotations

import pytest

from support.cli import Cli, failed


@pytest.fixture(scope="module")
async def busy(module_cli: Cli) -> Cli:
    """Pool ``errs`` {gpu: 4} whose subject ``team`` holds 1 GPU."""
    await module_cli.ok("pool", "create", "errs", "-c", '{"gpu": 4}')
    await module_cli.ok("pool", "attach-policy", "errs", "team")
    await module_cli.ok("request", "create", "-s", "team", "--pool", "errs", "--gpu", "1")
    return module_cli


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["pool", "create", "e1", "-c", '{"gpu": -1}'], "--capacity: gpu must be an integer"),
        (["pool", "create", "e2", "-c", '{"Bad Key": 1}'], "--capacity: bad resource key"),
        (["pool", "create", "e3", "--grace", "99999999"], "--grace: "),
        (["pool", "create", "Bad Name"], "NAME: must match"),
        (["pool", "update", "errs", "-c", '{"gpu": -3}'], "--capacity: gpu must be an integer"),
        (["pool", "attach-policy", "errs", "team", "-p", "99999999999"], "--priority: "),
        (["pool", "attach-policy", "errs", "t2", "-r", '{"gpu": -1}'], "--reserved: gpu must be"),
        (["pool", "attach-policy", "errs", "bad subject"], "SUBJECT: must match"),
        (["request", "create", "-s", "team", "--memory", "8XB"], '--memory: "8XB" is not'),
        (["request", "create", "-s", "team", "--cpu", "-1"], "--cpu: must be a number >= 0"),
        (["request", "create", "-s", "team", "-r", "tpu=-1"], "--resource: tpu must be"),
        (["request", "create", "-s", "bad subject", "--gpu", "1"], "--subject: must match"),
        (["request", "create", "-s", "team", "--lease", "999999999"], "--lease: "),
        (["request", "create", "-s", "team", "--max-retries", "99999"], "--max-retries: "),
        (["request", "list", "--status", "bogus"], "--status: "),
        (["request", "list", "--pool", "nope"], "--pool: pool 'nope' not found"),
    ],
)
async def test_bad_input_names_the_flag(busy: Cli, args: list[str], expected: str) -> None:
    err = failed(await busy.api(*args), code=1 if "not found" in expected else 2)
    assert err.startswith(expected), err
    assert "internal error" not in err


async def test_conflicts_name_the_pool_and_the_force_flag(busy: Cli) -> None:
    err = failed(await busy.api("pool", "detach-policy", "errs", "team", "-y"))
    assert err.startswith("the policy of team on pool errs has 1 allocated"), err
    assert err.endswith("delete with --force to cancel them"), err
    err = failed(await busy.api("pool", "delete", "errs", "-y"))
    assert err.startswith("pool errs has 1 allocated") and "--force" in err, err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["token", "revoke", "nope"], "token nope not found"),
        (["token", "create", "--role", "client", "--subject", "x["], "--subject: subject pattern"),
        (["token", "create", "--role", "client"], "--subject: a client token needs"),
    ],
)
async def test_token_mistakes_are_not_bugs(module_cli: Cli, args: list[str], expected: str) -> None:
    err = failed(await module_cli.db(*args), code=1 if "not found" in expected else 2)
    assert err.startswith(expected), err
