"""Fault tests (the reconciler's and the API's promises under crashes, kills, pauses and
network faults).

``--faults-long`` (or ``RESPOOL_FAULTS=long``) selects the long mode; every test prints its
figures, and the session's figures are repeated in the terminal summary.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from faults.pg import PgCluster
from support.db import migrated
from support.faults import FIGURES, long_mode


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults-long",
        action="store_true",
        default=False,
        help="run tests/faults in long mode (same as RESPOOL_FAULTS=long)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--faults-long", default=False):
        os.environ["RESPOOL_FAULTS"] = "long"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every fault test is ``slow`` (tens of seconds even in short mode); in long mode they get
    an hour (a 30-minute soak) instead of the default 300 s."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)
            if long_mode():
                item.add_marker(pytest.mark.timeout(3600))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("fault-test figures")
    for test, figures in FIGURES:
        text = ", ".join(f"{k}={v}" for k, v in figures.items())
        terminalreporter.write_line(f"{test}: {text}")


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    """A PostgreSQL server of this test's own, which it may crash; database ``respool`` is
    migrated (``cluster.url("respool")``)."""
    pg = PgCluster()
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
async def cluster_db(cluster: PgCluster) -> AsyncIterator[str]:
    """DSN of the migrated ``respool`` database on :func:`cluster`."""
    admin = await asyncpg.connect(cluster.url(), timeout=30)
    try:
        await admin.execute('CREATE DATABASE "respool"')
    finally:
        await admin.close()
    yield await migrated(cluster.url("respool"))
