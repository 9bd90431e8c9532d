"""Schemathesis against a running API's OpenAPI document."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from support.server import running_server

__all__ = ["schemathesis", "schemathesis_on_a_server"]


async def schemathesis(
    url: str, cwd: Path, *, examples: int, seed: int, within: float
) -> tuple[int | None, str]:
    """``schemathesis run`` (every check but positive_data_acceptance, one worker) against
    ``url``; its exit code and report. ``cwd``: it keeps a cache directory there."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/schema/openapi.json",
        "--checks", "all", "--exclude-checks", "positive_data_acceptance",
        "--max-examples", str(examples), "--seed", str(seed), "--workers", "1",
        "--request-timeout", "10", "--generation-database", "none", "--no-color",
        cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), within)
    return proc.returncode, out.decode(errors="replace")


async def schemathesis_on_a_server(
    db_url: str, cwd: Path, *, examples: int, seed: int, within: float
) -> tuple[int | None, str]:
    """:func:`schemathesis` against an API of its own on ``db_url``. A short max_wait: fuzzed
    ``wait=`` values must not hold the run for long."""
    async with running_server(db_url, max_wait=0.3, db_pool_size=4) as srv:
        return await schemathesis(srv.url, cwd, examples=examples, seed=seed, within=within)
