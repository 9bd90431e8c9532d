"""The CLI as a person at a terminal meets it (a real pty of 80 and 120 columns), and as a
script or a CI log does (a pipe): tables that say what they hold, bars that line up, no padding
in a pipe, one-line errors with the exit code docs/cli.md gives, and ``serve`` that says it
listens only once it does."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest
from cli_terminal import ROOT, Run, in_pipe, in_terminal

from support.cli import Cli, failed
from support.ports import free_port

PROD = "orchestrator:prod-stack"
DEV = "orchestrator:dev-stack"
OFFICE_HOURS = "mon-fri 08:00-18:00 Europe/Berlin"


@pytest.fixture(scope="module")
async def shop(module_cli: Cli) -> Cli:
    """``tty-gpus`` {gpu: 8, step_run: 32} with the walkthrough's policies (prod in office
    hours, dev with a limit, a team pattern) and a dev request holding 2 GPUs;
    ``tty-licences`` {licence_x: 3}; ``tty-boxes``, made for nodes, without one yet."""
    cli = module_cli
    await cli.ok("pool", "create", "tty-gpus", "-c", "{gpu: 8, step_run: 32}")
    await cli.ok("pool", "create", "tty-licences", "-c", "{licence_x: 3}", "-d", "Simulator")
    await cli.ok("pool", "create", "tty-boxes")
    await cli.ok(
        "pool", "attach-policy", "tty-gpus", PROD, "-p", "10", "-r", "{gpu: 4, step_run: 8}",
        "--window", OFFICE_HOURS,
    )  # fmt: skip
    await cli.ok("pool", "attach-policy", "tty-gpus", DEV, "-l", "{gpu: 6}")
    await cli.ok("pool", "attach-policy", "tty-gpus", "team-vision:*", "-r", "{gpu: 2}")
    await cli.ok("pool", "attach-policy", "tty-licences", PROD)
    await cli.ok("request", "create", "-s", DEV, "--pool", "tty-gpus", "--gpu", "2")
    await cli.ok("request", "create", "-s", PROD, "--pool", "tty-licences", "-r", "licence_x=1")
    return cli


async def _terminal(cli: Cli, *args: str, columns: int) -> Run:
    run = await asyncio.to_thread(in_terminal, *args, "--url", cli.url, columns=columns)
    assert run.code == 0, (run.stdout, run.stderr)
    assert "Traceback" not in run.stdout + run.stderr
    return run


def _fits(text: str, columns: int) -> list[str]:
    """The lines of ``text``, each checked: within ``columns``, no trailing spaces."""
    lines = text.splitlines()
    assert lines, text
    assert not [line for line in lines if len(line) > columns], text
    assert not [line for line in lines if line.endswith(" ")], text
    return lines


def _header(lines: list[str]) -> str:
    return next(line for line in lines if "SUBJECT" in line or "NAME" in line)


# --- tables at 80 and 120 columns ---------------------------------------------------------------


@pytest.mark.parametrize("columns", [80, 120])
async def test_list_policies_gives_the_room_to_subjects_not_to_empty_columns(
    shop: Cli, columns: int
) -> None:
    run = await _terminal(shop, "pool", "list-policies", "tty-gpus", columns=columns)
    lines = _fits(run.stdout, columns)
    header = _header(lines)
    # Every subject whole: no "orchestrator:p…".
    for subject in (PROD, DEV, "team-vision:*"):
        assert any(line.split()[0] == subject for line in lines[1:]), run.stdout
    # Columns with nothing in them are left out: nobody borrows, no policy has a lane.
    assert "BORROWED" not in header and "LANE" not in header, header
    assert "SUBJECT" in header and "RESERVED" in header and "ACTIVE" in header
    if columns == 120:
        # When office hours begin or end, kept at 120 columns.
        assert "NEXT CHANGE" in header, run.stdout
        prod = next(line for line in lines if line.startswith(f" {PROD} "))
        assert "Z" in prod.split()[-1] and prod.split()[-1][:2] == "20", prod


async def test_list_policies_in_a_pipe_and_wide_keep_every_column(shop: Cli) -> None:
    """Scripts that read the table (and ``-o wide``) still get every column, empty or not."""
    wide = (await shop.ok("pool", "list-policies", "tty-gpus", "-o", "wide")).stdout
    for column in ("BORROWED", "LANE", "LIMIT", "WINDOWS", "NEXT CHANGE", "ID"):
        assert column in wide.splitlines()[0], wide
    assert OFFICE_HOURS in wide
    policies = await shop.json("pool", "list-policies", "tty-gpus")
    assert {p["subject"] for p in policies} == {PROD, DEV, "team-vision:*"}
    assert all("borrowed" in p and "priority_lane" in p for p in policies)


@pytest.mark.parametrize("columns", [80, 120])
async def test_pool_list_bars_line_up_across_pools(shop: Cli, columns: int) -> None:
    run = await _terminal(shop, "pool", "list", columns=columns)
    lines = _fits(run.stdout, columns)
    bars = [line for line in lines if "░" in line or "█" in line]
    assert len(bars) >= 3, run.stdout  # gpu and step_run of tty-gpus, licence_x
    starts = {min(i for i in (line.find("░"), line.find("█")) if i >= 0) for line in bars}
    assert len(starts) == 1, run.stdout


@pytest.mark.parametrize("columns", [80, 120])
async def test_request_tables_leave_out_the_implicit_step_run(shop: Cli, columns: int) -> None:
    run = await _terminal(shop, "request", "list", "--pool", "tty-gpus", columns=columns)
    lines = _fits(run.stdout, columns)
    row = next(line for line in lines if " allocated " in line)
    assert "gpu=2" in row and "step_run" not in row, run.stdout
    held = await _terminal(shop, "pool", "requests", "tty-gpus", "--view", "active", columns=80)
    assert "step_run" not in held.stdout and "gpu=2" in held.stdout, held.stdout
    # The data keeps it.
    found = await shop.json("request", "list", "--pool", "tty-gpus")
    assert found[0]["resources"] == {"gpu": 2, "step_run": 1}
    # And describe, the whole request, says it.
    describe = (await shop.ok("request", "describe", found[0]["id"])).stdout
    assert "gpu=2 step_run=1" in describe


@pytest.mark.parametrize("columns", [80, 120])
async def test_a_pool_made_for_nodes_says_it_has_none_yet(shop: Cli, columns: int) -> None:
    run = await _terminal(shop, "pool", "describe", "tty-boxes", columns=columns)
    text = run.stdout
    _fits(text, columns)
    assert "abstract units" not in text, text
    nodes = next(line for line in text.splitlines() if line.startswith("Nodes"))
    assert "none yet" in nodes, text
    assert "Capacity: none yet (no nodes)" in text and "KEY" not in text, text
    listed = await _terminal(shop, "pool", "list", columns=columns)
    header, *rows = listed.stdout.splitlines()
    row = next(line for line in rows if line.startswith(" tty-boxes "))
    nodes = header.index("NODES")
    assert row[nodes : nodes + 5].strip() == "0", listed.stdout  # (``-``: abstract units)


async def test_a_pool_with_nodes_shows_how_many_per_state(cli: Cli) -> None:
    await cli.ok("pool", "create", "boxes")
    for name in ("box-1", "box-2"):
        await cli.ok("node", "add", name, "--pool", "boxes", "--devices", "gpu=0,1")
    await cli.ok("node", "cordon", "box-2")
    text = (await cli.ok("pool", "describe", "boxes")).stdout
    nodes = next(line for line in text.splitlines() if line.startswith("Nodes"))
    assert nodes.split(None, 1)[1] == "2 (1 active, 1 cordoned)", text
    assert "abstract units" not in text and "none yet" not in text


# --- empty tables -------------------------------------------------------------------------------


async def test_an_empty_table_is_one_line_saying_so(cli: Cli) -> None:
    for args, line in [
        (("pool", "list"), "no pools"),
        (("request", "list"), "no live requests (--all shows finished ones too)"),
        (("request", "list", "--all"), "no requests"),
        (("node", "list"), "no nodes"),
        (("pool", "list-policies"), "no policies"),
    ]:
        result = await cli.ok(*args)
        assert result.stdout == f"{line}\n", (args, result.stdout)
        assert await cli.json(*args) == [], args  # scripts: unchanged
        assert (await cli.ok(*args, "-o", "yaml")).stdout == "[]\n", args
    run = await _terminal(cli, "request", "list", "--all", columns=80)
    assert run.stdout.strip() == "no requests", run.stdout
    await cli.ok("pool", "create", "quiet", "-c", "{gpu: 1}")
    held = (await cli.ok("pool", "requests", "quiet")).stdout
    assert held == "no requests\n", held
    described = (await cli.ok("pool", "describe", "quiet")).stdout
    assert "Policies: none" in described and "SUBJECT" not in described, described


# --- no padding ---------------------------------------------------------------------------------


async def test_piped_output_has_no_padding(shop: Cli) -> None:
    """``request describe | less``, ``pool describe > file``: lines end where their text does."""
    found = await shop.json("request", "list", "--pool", "tty-gpus")
    for args in (
        ("request", "describe", found[0]["id"]),
        ("pool", "describe", "tty-gpus"),
        ("pool", "list"),
        ("pool", "list-policies"),
        ("request", "list"),
        ("request", "events", found[0]["id"]),
    ):
        run = await asyncio.to_thread(in_pipe, *args, "--url", shop.url)
        assert run.code == 0, (args, run.stderr)
        padded = [line for line in run.stdout.splitlines() if line.endswith(" ")]
        assert not padded, (args, run.stdout)
    run = await asyncio.to_thread(in_pipe, "request", "describe", found[0]["id"], "--url", shop.url)
    longest = max(run.stdout.splitlines(), key=len)
    assert len(longest) < 100, longest


@pytest.mark.parametrize("columns", [80, 120])
async def test_describe_in_a_terminal_has_no_padding(shop: Cli, columns: int) -> None:
    found = await shop.json("request", "list", "--pool", "tty-gpus")
    run = await _terminal(shop, "request", "describe", found[0]["id"], columns=columns)
    _fits(run.stdout, columns)


# --- errors and exit codes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "starts"),
    [
        (["pool", "create", "Bad_Name"], "NAME: must match"),
        (["request", "list", "--status", "quued"], "--status: 'quued' is not a status"),
        (
            ["pool", "attach-policy", "tty-gpus", "x:y",
             "--window", "mon-fri 08:00-10:00 Europe/Berln"],
            "--window: unknown time zone Europe/Berln",
        ),
        (
            ["pool", "attach-policy", "tty-gpus", "x:y", "--window", "sat 10:00-12:00 UTC",
             "--window", "mon-fri 08:00-10:00 Europe/Berln"],
            "--window 'mon-fri 08:00-10:00 Europe/Berln': unknown time zone Europe/Berln",
        ),
        (["pool", "update", "tty-gpus", "--grace", "99999999"], "--grace: "),
        (["pool", "list", "--url", "localhost:1"], "--url must start with http://"),
    ],
)  # fmt: skip
async def test_a_malformed_value_exits_2_naming_what_was_typed(
    shop: Cli, args: list[str], starts: str
) -> None:
    err = failed(await shop.api(*args) if "--url" not in args else await shop.run(*args), code=2)
    assert err.startswith(starts), err
    assert "windows[" not in err and "timezone" not in err
    # Nothing was changed.
    assert not await shop.json("pool", "list-policies", "tty-gpus", "--subject", "x:y")


async def test_a_window_without_a_zone_shows_what_a_window_looks_like(shop: Cli) -> None:
    result = await shop.api("pool", "attach-policy", "tty-gpus", "x:y", "--window", "09:00-17:00")
    err = failed(result, code=2)
    assert "'09:00-17:00' has no time zone" in err and "'09:00-17:00 UTC'" in err, err
    other = failed(
        await shop.api("pool", "attach-policy", "tty-gpus", "x:y", "--window", "9-17"), code=2
    )
    assert "'mon-fri 09:00-17:00 Europe/Berlin'" in other and "START/END" in other, other


async def test_other_errors_still_exit_1(shop: Cli) -> None:
    assert failed(await shop.api("pool", "describe", "nope"), code=1) == "pool 'nope' not found"
    err = failed(await shop.api("pool", "attach-policy", "tty-gpus", "x:y", "-r", "{gpu: 100}"))
    assert "reserved" in err
    assert failed(await shop.api("request", "list", "--pool", "nope"), code=1).startswith(
        "--pool: pool 'nope' not found"
    )


# --- serve --------------------------------------------------------------------------------------


def _serve(port: int, db_url: str, *extra: str) -> Run:
    env = {"RESPOOL_DATABASE_URL": db_url, "RESPOOL_HOST": "127.0.0.1"}
    return in_pipe("serve", "--port", str(port), "--no-reconciler", *extra, env=env, timeout=120)


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one process", "workers"])
async def test_serve_on_a_port_in_use_says_one_line_and_never_that_it_listens(
    module_db_url: str, workers: list[str]
) -> None:
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = await asyncio.to_thread(_serve, port, module_db_url, *workers)
    finally:
        taken.close()
    assert run.code == 1, (run.stdout, run.stderr)
    assert run.stderr == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert run.stdout == ""


def _serve_and_ask(port: int, db_url: str) -> tuple[str, int]:
    """``respool serve`` until it says where it listens; then one API call there, and stop."""
    env = {"RESPOOL_DATABASE_URL": db_url, "RESPOOL_HOST": "127.0.0.1", "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--no-reconciler"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "RESPOOL_URL"} | env,
        cwd=ROOT,
        text=True,
    ) as proc:
        try:
            assert proc.stderr is not None
            said = ""
            for line in proc.stderr:
                if line.startswith("respool API on"):
                    said = line
                    break
            # Said once bound: the API answers there (when its startup is over).
            status = httpx.get(f"http://127.0.0.1:{port}/v1/pools", timeout=30).status_code
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    return said, status


async def test_serve_says_where_it_listens_and_answers_there(module_db_url: str) -> None:
    port = free_port()
    said, status = await asyncio.to_thread(_serve_and_ask, port, module_db_url)
    assert said.startswith(f"respool API on http://127.0.0.1:{port} (database "), said
    assert status == 200
