"""Every Python example of docs/client.md runs, each in a process of its own, against a live
server (the API in the test's event loop, like tests/api)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from support.http import ok, pool_with_policy
from support.server import Server

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
# The recipes at the end need Airflow or Prefect; every example before them runs as written.
_RUNNABLE = DOC.read_text().split("## Recipes")[0]
EXAMPLES = re.findall(r"```python\n(.*?)```", _RUNNABLE, flags=re.DOTALL)


def test_the_page_has_examples() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
async def test_example_runs(server: Server, index: int) -> None:
    capacity = {"gpu": 8, "mcpu": 8000, "memory_mb": 16000, "step_run": 10}
    await pool_with_policy(server.client, subject="orchestrator:prod-stack", capacity=capacity)
    env = {**os.environ, "RESPOOL_URL": server.url}
    env.pop("RESPOOL_TOKEN", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        EXAMPLES[index],
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "'gpu':" in out.decode()
    # released on exit: nothing is held any more
    assert not any(ok(await server.client.get("/v1/pools/p"))["usage"].values())


async def test_decorator_holds_for_the_call_sync_and_async(server: Server) -> None:
    """``@allocated``: the grant is passed in, the units are held during the call only."""
    from respool_client import ResourceSettings, allocated

    await pool_with_policy(server.client, subject="team")
    settings = ResourceSettings(gpu_count=2)

    async def usage() -> int:
        return int(ok(await server.client.get("/v1/pools/p"))["usage"].get("gpu", 0))

    @allocated(subject="team", url=server.url, settings=settings)
    async def step_async(x: int, grant: Any = None) -> tuple[int, dict[str, int]]:
        return x + 1, dict(grant.resources)

    got, resources = await step_async(1)
    assert got == 2 and resources["gpu"] == 2
    assert await usage() == 0

    seen: list[int] = []

    @allocated(subject="team", url=server.url, resources={"gpu": 3})
    def step_sync() -> str:
        seen.append(1)
        return "done"

    assert await asyncio.to_thread(step_sync) == "done"  # the server runs in this loop
    assert seen == [1] and await usage() == 0
