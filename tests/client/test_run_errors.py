"""``respool run``'s errors are one line, like the rest of the CLI (docs/client.md, "Options and
exit status"): an unknown option says which one was meant, a value the server refuses is named
by the option the user typed (not the API's field, nor the HTTP status), and a malformed value
exits 2. Real wrapper processes against a real server."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator

import pytest

from support.http import ok
from support.server import Server, running_server

EXIT_USAGE = 2
EXIT_API = 69


@pytest.fixture(scope="module")
async def api(module_db_url: str) -> AsyncIterator[Server]:
    async with running_server(module_db_url) as srv:
        ok(await srv.client.post("/v1/pools", json={"name": "box", "capacity": {"gpu": 2}}), 201)
        body = {"subject": "team", "pool": "box", "reserved": {"gpu": 0}}
        ok(await srv.client.post("/v1/policies", json=body), 201)
        yield srv


async def _run(server: Server, *options: str) -> tuple[int, list[str]]:
    env = {**os.environ, "RESPOOL_URL": server.url, "RESPOOL_SUBJECT": "team"}
    env.pop("RESPOOL_TOKEN", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "respool_client.run", *options, "--", sys.executable, "-c", "pass",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().splitlines()
    # (a loaded machine may add "no answer from … yet; still waiting" before the answer)
    return await proc.wait(), [line for line in lines if "still waiting" not in line]


async def test_a_misspelt_option_is_one_line_with_a_suggestion(api: Server) -> None:
    code, lines = await _run(api, "--gpus", "2")
    assert code == EXIT_USAGE
    assert len(lines) == 1, lines  # no usage block
    assert "--gpus" in lines[0] and "did you mean --gpu?" in lines[0]
    code, lines = await _run(api, "--memroy=8GB")
    assert code == EXIT_USAGE and len(lines) == 1, lines
    assert "did you mean --memory?" in lines[0]


async def test_a_malformed_value_is_one_line_naming_the_option(api: Server) -> None:
    code, lines = await _run(api, "--gpu", "two")
    assert code == EXIT_USAGE
    assert len(lines) == 1, lines
    assert "run: error: --gpu: " in lines[0] and "'two'" in lines[0]


@pytest.mark.parametrize(
    ("options", "option", "api_field"),
    [
        (("--memory", "lots"), "--memory", "settings.memory"),
        (("--resource", "gpu=-1"), "--resource", "resources.gpu"),
        (("--resource", "GPU!=1"), "--resource", "resources.GPU!"),
        (("--selector", "bad key=1"), "--selector", "node_selector"),
        (("--subject", "bad subject"), "--subject", "(field subject)"),
    ],
)
async def test_a_value_the_server_refuses_is_named_as_typed(
    api: Server, options: tuple[str, ...], option: str, api_field: str
) -> None:
    code, lines = await _run(api, *options)
    assert code == EXIT_USAGE, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"respool: error: {option}: "), lines
    assert api_field not in lines[0] and "400" not in lines[0] and "(field" not in lines[0]


async def test_an_unknown_pool_is_one_line_without_http(api: Server) -> None:
    code, lines = await _run(api, "--pool", "boxx", "--gpu", "1")
    assert code == EXIT_API
    assert lines == ["respool: error: --pool: pool 'boxx' not found"]
