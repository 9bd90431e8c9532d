"""Shared CLI plumbing: running async code, turning known errors into one-line messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NoReturn, TypeVar

import asyncpg
import typer

from app.db.connect import APP_CLI, connect
from app.db.dsn import resolve_database_url
from app.db.embedded import EmbeddedDatabaseError
from app.db.migrate import MigrationError
from app.settings import Settings, SettingsError

__all__ = [
    "CliError",
    "KNOWN_ERRORS",
    "confirm",
    "database",
    "describe_error",
    "fail",
    "handle_errors",
    "run_async",
]

T = TypeVar("T")


class CliError(Exception):
    """A user-facing failure: printed as ``error: <message>``, exit code 1."""


KNOWN_ERRORS: tuple[type[BaseException], ...] = (
    CliError,
    SettingsError,
    MigrationError,
    EmbeddedDatabaseError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,  # includes ClientConfigurationError (bad DSN options)
    OSError,  # connection refused, unknown host, missing socket, ...
    TimeoutError,
)


def describe_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError | TimeoutError) and not isinstance(exc, FileNotFoundError):
        return f"cannot connect to the database: {text}"
    if isinstance(exc, asyncpg.PostgresError):
        return f"database: {text}"
    return text


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def confirm(question: str, *, yes: bool) -> None:
    """Ask ``question`` on stderr unless ``yes``; anything but yes (also no input) aborts."""
    if yes:
        return
    try:
        answer = typer.confirm(question, default=False, err=True)
    except typer.Abort:  # no input (EOF) or Ctrl-C: end the prompt's line
        typer.echo(err=True)
        raise
    if not answer:
        raise typer.Abort()


@contextmanager
def handle_errors() -> Iterator[None]:
    """Convert known errors into ``error: ...`` on stderr and exit code 1 (no traceback)."""
    try:
        yield
    except KNOWN_ERRORS as exc:
        fail(describe_error(exc))


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine for a command, with known errors reported as one line."""
    with handle_errors():
        return asyncio.run(coro)


@asynccontextmanager
async def database() -> AsyncIterator[asyncpg.Connection]:
    """A connection to the configured database (RESPOOL_DATABASE_URL, else embedded)."""
    dsn = resolve_database_url(Settings.from_env())
    conn = await connect(dsn, application_name=APP_CLI)
    try:
        yield conn
    finally:
        await conn.close()
