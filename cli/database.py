"""Plumbing of the commands that talk to the database (db, token, serve, reconcile): a
connection, running their coroutine, and their errors as one line. The HTTP commands never
import this module, so they need nothing of the server package (``app``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import asyncpg

from app.db.connect import APP_CLI, connect
from app.db.embedded import EmbeddedDatabaseError, embedded_database_url, embedded_server_running
from app.db.errors import EngineError
from app.db.migrate import MigrationError
from app.settings import Settings, SettingsError
from cli.common import (
    KNOWN_ERRORS,
    USAGE,
    describe_error,
    exit_code_of,
    fail,
    names_parameter,
    user_message,
)

__all__ = [
    "DATABASE_ERRORS",
    "database",
    "database_url",
    "describe_database_error",
    "handle_errors",
    "run_async",
]

T = TypeVar("T")

DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    EngineError,  # bad input, not found, conflicts
    SettingsError,
    MigrationError,
    EmbeddedDatabaseError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,  # includes ClientConfigurationError (bad DSN options)
)


def describe_database_error(exc: BaseException) -> str:
    """``exc``, met while talking to the database, as one line."""
    if isinstance(exc, EngineError):
        return user_message(" ".join(exc.message.split()), exc.field)
    text = describe_error(exc)
    if isinstance(exc, OSError | TimeoutError) and not isinstance(exc, FileNotFoundError):
        return f"cannot connect to the database: {text}"
    if isinstance(exc, asyncpg.PostgresError):
        return f"database: {text}"
    return text


@contextmanager
def handle_errors() -> Iterator[None]:
    """Convert known errors into ``error: ...`` on stderr and exit code 1, or 2 for a malformed
    value the user typed (no traceback)."""
    try:
        yield
    except (*KNOWN_ERRORS, *DATABASE_ERRORS) as exc:
        typed = isinstance(exc, EngineError) and exc.status_code in (400, 422)
        bad = typed and names_parameter(getattr(exc, "field", None))
        fail(describe_database_error(exc), USAGE if bad else exit_code_of(exc))


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine for a command, with known errors reported as one line."""
    with handle_errors():
        return asyncio.run(coro)


def database_url(*, keep_running: bool = False) -> str:
    """The DSN the service uses: RESPOOL_DATABASE_URL, else the embedded server's (started if
    needed). A command stops the embedded server when it exits only if it started it and no
    one else uses it; with ``keep_running`` never (``respool db url``: the DSN must outlive it).
    """
    settings = Settings.from_env()
    if settings.database_url:
        return settings.database_url
    return embedded_database_url(keep_running=keep_running or embedded_server_running())


@asynccontextmanager
async def database() -> AsyncIterator[asyncpg.Connection]:
    """A connection to the configured database (RESPOOL_DATABASE_URL, else embedded)."""
    dsn = database_url()
    conn = await connect(dsn, application_name=APP_CLI)
    try:
        yield conn
    finally:
        await conn.close()
