"""CLI tests: Typer's runner against a live API server and PostgreSQL.

The server runs in the test's event loop, so every CLI invocation runs in a worker thread
(the CLI is synchronous: httpx, and ``asyncio.run`` for database commands).

This folder has no ``__init__.py`` on purpose: as a package it would be imported as ``cli`` and
shadow the real ``cli`` package. Its modules therefore have names unique in tests/.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from support.cli import Cli
from support.server import running_server


@pytest.fixture
async def cli(db_url: str) -> AsyncIterator[Cli]:
    """A CLI against a server and database of this test's own."""
    async with running_server(db_url) as srv:
        yield Cli(url=srv.url, db_url=db_url)


@pytest.fixture(scope="module")
async def module_cli(module_db_url: str) -> AsyncIterator[Cli]:
    """A CLI against a server shared by the module (tests use names of their own)."""
    async with running_server(module_db_url) as srv:
        yield Cli(url=srv.url, db_url=module_db_url)


@pytest.fixture
def smi_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory first on PATH (and the only one: no real nvidia-smi can answer)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin")
    return bin_dir
