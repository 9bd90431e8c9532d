"""Tables fit the terminal: at COLUMNS=80 and 120 no line of ``pool list``, ``pool
list-policies``, ``pool describe`` or ``request list`` is longer than the terminal; long cells end
in an ellipsis and low-value columns go first; ``-o wide`` shows every column, uncut; a pipe
(no COLUMNS) gets whole rows."""

from __future__ import annotations

import pytest

from support.cli import Cli

LONG_DESCRIPTION = "Shared A100 GPUs of the training team in building four, second floor"
LONG_SUBJECT = "team-vision:hyperparameter-sweep-for-the-segmentation-model"


@pytest.fixture(scope="module")
async def crowded(module_cli: Cli) -> Cli:
    """A pool with long names, a pattern policy with a window, holders, a queue, labels and a
    node: every table at its widest."""
    cli = module_cli
    await cli.ok("pool", "create", "wide-pool", "-d", LONG_DESCRIPTION)
    await cli.ok(
        "node", "add", "gpu-box-01", "--pool", "wide-pool", "-c", '{"mcpu": 64000, "step_run": 16}',
        "--devices", "gpu=0,1,2,3", "--label", "gpu-type=A100-80G", "--label", "rack=r12",
    )  # fmt: skip
    await cli.ok(
        "pool", "attach-policy", "wide-pool", "orchestrator:production-training",
        "-p", "10", "-r", '{"gpu": 2, "step_run": 8}', "-l", '{"gpu": 4, "mcpu": 32000}',
        "--window", "mon-fri 09:00-17:00 Europe/Berlin",
    )  # fmt: skip
    await cli.ok("pool", "attach-policy", "wide-pool", "team-vision:*", "-r", '{"gpu": 2}')
    await cli.ok(
        "request", "create", "-s", LONG_SUBJECT, "--pool", "wide-pool", "--gpu", "3",
        "--label", "team=vision", "--label", "run=sweep-2026-11-25-segmentation",
    )  # fmt: skip
    queued = await cli.json(
        "request", "create", "-s", "orchestrator:production-training", "--pool", "wide-pool",
        "--gpu", "4", "--label", "team=platform",
    )  # fmt: skip
    assert queued["status"] == "queued" and queued["message"]
    return cli


COMMANDS = [
    ("pool", "list"),
    ("pool", "list-policies"),
    ("pool", "describe", "wide-pool"),
    ("request", "list"),
    ("pool", "requests", "wide-pool"),
    ("node", "list"),
]


async def _lines(cli: Cli, *args: str, columns: str | None) -> list[str]:
    result = await cli.api(*args, COLUMNS=columns)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout.splitlines()


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
async def test_tables_fit_the_terminal(
    crowded: Cli, command: tuple[str, ...], columns: int
) -> None:
    lines = await _lines(crowded, *command, columns=str(columns))
    too_long = [line for line in lines if len(line) > columns]
    assert not too_long, "\n".join(too_long)


async def test_long_cells_end_in_an_ellipsis_and_low_value_columns_go_first(crowded: Cli) -> None:
    text = "\n".join(await _lines(crowded, "pool", "list", columns="80"))
    assert "wide-pool" in text  # names are never cut
    assert LONG_DESCRIPTION not in text and LONG_DESCRIPTION[:12] in text and "…" in text
    assert "QUEUEING" not in text  # dropped before the description is cut to nothing

    policies = "\n".join(await _lines(crowded, "pool", "list-policies", columns="80"))
    assert "SUBJECT" in policies and "RESERVED" in policies and "ACTIVE" in policies
    assert " ID " not in policies and "NEXT CHANGE" not in policies

    at_120 = "\n".join(await _lines(crowded, "pool", "list-policies", columns="120"))
    assert len(at_120.splitlines()[0].split()) > len(policies.splitlines()[0].split())

    requests = "\n".join(await _lines(crowded, "request", "list", columns="80"))
    assert "LABELS" not in requests and "STATUS" in requests and "REASON" in requests


async def test_wide_shows_every_column_uncut(crowded: Cli) -> None:
    text = "\n".join(await _lines(crowded, "request", "list", "-o", "wide", columns="80"))
    header = text.splitlines()[0].split()
    for column in ("ID", "SUBJECT", "POOL", "STATUS", "REASON", "RESOURCES", "AGE", "LABELS"):
        assert column in header
    assert LONG_SUBJECT in text and "run=sweep-2026-11-25-segmentation team=vision" in text
    assert "…" not in text

    policies = "\n".join(await _lines(crowded, "pool", "list-policies", "-o", "wide", columns="80"))
    for column in ("ID", "COVERS", "NEXT CHANGE", "BORROWED", "LANE", "WINDOWS", "LIMIT"):
        assert column in policies
    assert "mon-fri 09:00-17:00 Europe/Berlin" in policies


async def test_a_pipe_gets_whole_rows(crowded: Cli) -> None:
    """No terminal and no COLUMNS: nothing is cut (scripts that grep a table keep working)."""
    text = "\n".join(await _lines(crowded, "pool", "list", columns=None))
    assert LONG_DESCRIPTION in text and "…" not in text
