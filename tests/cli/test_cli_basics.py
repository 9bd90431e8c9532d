"""Every command: help with an example, shell completion, one-line errors, exit codes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import cli.options
from cli.main import app
from support.cli import Cli, failed

NOWHERE = "http://127.0.0.1:1"  # nothing listens on port 1


def _leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield path
        return
    for name, sub in subcommands.items():
        yield from _leaves(sub, (*path, name))


COMMANDS = sorted(_leaves(typer.main.get_command(app)))


def test_the_spec_commands_exist() -> None:
    names = {" ".join(c) for c in COMMANDS}
    for expected in (
        "pool create", "pool list", "pool describe", "pool update", "pool delete",
        "pool attach-policy", "pool detach-policy", "pool list-policies", "pool requests",
        "request create", "request list", "request describe", "request events",
        "request release", "request cancel", "request delete", "request prune",
        "apply", "export", "serve", "reconcile", "db migrate", "db status",
        "token create", "token list", "token revoke",
    ):  # fmt: skip
        assert expected in names


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_has_an_example(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], prog_name="respool")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Example" in text, text
    example = text.split("Example", 1)[1]
    assert f"respool {' '.join(command)}" in example, text


@pytest.mark.parametrize("command", [(), *COMMANDS], ids=lambda c: " ".join(c) or "respool")
def test_help_cites_no_internal_spec(command: tuple[str, ...]) -> None:
    """Help is for users: it points at the docs pages, never at the project's internal spec."""
    text = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"}).stdout
    assert "SPEC" not in text and "§" not in text, text


def test_shell_completion() -> None:
    runner = CliRunner()
    assert "--install-completion" in runner.invoke(app, ["--help"]).stdout

    def complete(words: str) -> list[str]:
        env = {
            "_RESPOOL_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
        }
        result = runner.invoke(app, [], prog_name="respool", env=env)
        assert result.exit_code == 0, result.output
        return result.stdout.split()

    assert complete("respool po") == ["pool"]
    assert "attach-policy" in complete("respool pool ")
    assert complete("respool pool list -o ") == ["table", "wide", "json", "yaml"]
    assert complete("respool pool requests x --view ") == ["queued", "active", "all"]
    script = runner.invoke(app, ["--show-completion", "bash"], prog_name="respool").stdout
    assert "_RESPOOL_COMPLETE=complete_bash" in script


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("respool ")


async def test_unreachable_api_is_one_line() -> None:
    cli = Cli(url=NOWHERE, db_url="")
    for args in (["pool", "list"], ["request", "list"], ["export"], ["pool", "describe", "x"]):
        err = failed(await cli.api(*args))
        assert err.startswith(f"cannot reach the respool API at {NOWHERE}"), err
    env = await cli.run("pool", "list", RESPOOL_URL=NOWHERE)  # the variable works too
    assert failed(env).startswith(f"cannot reach the respool API at {NOWHERE}")
    assert "http://" in failed(await cli.run("pool", "list", "--url", "localhost:8080"), code=2)


async def test_usage_errors_exit_2_in_one_line() -> None:
    cli = Cli(url=NOWHERE, db_url="")
    assert "No such command" in failed(await cli.run("poool"), code=2)
    assert "No such option" in failed(await cli.run("pool", "list", "--bogus"), code=2)
    assert "'xml'" in failed(await cli.run("pool", "list", "-o", "xml"), code=2)
    err = failed(await cli.run("pool", "create", "-c", "{gpu: 1}"), code=2)
    assert err.endswith("(see 'respool pool create --help')") or "--help" in err


async def test_unexpected_error_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> None:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cli.options, "connect_api", broken)
    err = failed(await Cli(url=NOWHERE, db_url="").api("pool", "list"))
    assert err.startswith("internal error (ZeroDivisionError: boom)")


async def test_server_errors_are_one_line(module_cli: Cli) -> None:
    """A 4xx answer becomes ``error: <detail>``; JSON output stays machine-readable."""
    err = failed(await module_cli.api("pool", "describe", "missing", "-o", "json"))
    assert "missing" in err and err.endswith("not found")


async def test_db_status(module_cli: Cli) -> None:
    result = await module_cli.db("db", "status")
    assert result.exit_code == 0 and "schema: current" in result.stdout
