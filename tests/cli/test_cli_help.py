"""Every command's ``--help`` reads well at 80 columns: prose wrapped by the terminal (not by the
docstring), examples one command a line (continued with ``\\`` before an option, never cut),
plain metavars, nothing cut with an ellipsis, no reference to documents users do not have."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from cli.main import app

# ``respool run``'s options and help are the light client's (its own argparse help).
NOT_OURS = {("run",)}


def _paths(command: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        if not getattr(sub, "hidden", False):
            out += _paths(sub, (*prefix, name))
    return out


COMMANDS = [p for p in _paths(typer.main.get_command(app)) if p not in NOT_OURS]


def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_command_is_walked() -> None:
    assert len(COMMANDS) > 40
    assert ("request", "create") in COMMANDS and ("pool", "attach-policy") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "respool")
def test_help_reads_well_at_80_columns(path: tuple[str, ...]) -> None:
    text = _help(path)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    # plain metavars: no Python type names
    assert not re.search(r"<(str|int|float|bool|Decimal|list\[|int range|float range)", text), text
    assert "…" not in text, text  # nothing cut: option names, metavars, words
    assert "SPEC" not in text and "§" not in text and not re.search(r"issue \d", text), text

    # examples: each command starts a line; a continuation follows a line ending in "\"
    if " Examples" in lines:
        block = lines[lines.index(" Examples") + 1 :]
        previous = ""
        for line in block:
            if not line.strip():
                continue
            if line.startswith(" respool") or line.startswith(" RESPOOL_"):
                assert not previous.rstrip().endswith("\\"), (previous, line)
            else:
                assert line.startswith("     ") and previous.rstrip().endswith("\\"), (
                    f"an example wrapped mid-command:\n{previous}\n{line}"
                )
            previous = line


def test_prose_is_wrapped_by_the_terminal_not_by_the_docstring() -> None:
    text = _help(("pool", "attach-policy"))
    # the docstring breaks after "covers: a"; the terminal decides where lines end now
    assert "covers: a request's policy" in " ".join(text.split())
    assert not any(line.rstrip().endswith("covers: a") for line in text.splitlines())


def test_the_gang_flag_is_whole_and_its_other_spelling_still_works() -> None:
    text = _help(("request", "create"))
    assert re.search(r"--gang\s", text) and "--all-or-nothing" in " ".join(text.split())
    gang = CliRunner().invoke(
        app, ["request", "create", "-s", "x", "--all-or-nothing", "--dry-run"]
    )
    assert gang.exit_code == 2 and "--dry-run" in gang.stderr  # parsed, then refused as before


def test_metavars_are_plain_words() -> None:
    text = _help(("request", "create"))
    for metavar in ("SUBJECT", "NUMBER", "table|wide|json|yaml", "KEY=VALUE"):
        assert metavar in text
