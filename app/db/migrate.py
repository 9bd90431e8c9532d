"""Schema migrations: numbered forward-only files plus repeatable functions and views.

Layout (under :func:`app.db.sqlfiles.sql_dir`):

* ``migrations/NNNN_name.sql`` — applied once each, in version order, each in its own
  transaction, recorded in ``respool.schema_migrations`` with a sha256 checksum. An applied file
  whose checksum changed (or that disappeared) is an error.
* ``functions/*.sql`` then ``views/*.sql`` (sorted by file name) — repeatable; all of them are
  re-applied in one transaction whenever any changed, is new or was removed, after dropping every
  view in schema ``respool`` and every function there that no migration object (trigger,
  constraint, default) needs, so a changed signature leaves no stale overload behind.
  Recorded in ``respool.schema_repeatables``.

A session-level advisory lock serializes concurrent migrators on the same database.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from importlib.resources.abc import Traversable
from pathlib import Path

import asyncpg
import msgspec

from app.db.named import query
from app.db.sqlfiles import sql_dir

__all__ = [
    "LOCK_KEY",
    "MigrateReport",
    "MigrationError",
    "SchemaStatus",
    "SqlFile",
    "migrate",
    "status",
]

# pg_advisory_lock key: b"respool\x00" as a big-endian int64.
LOCK_KEY = 0x72657370_6F6F6C00

_MIGRATION_NAME = re.compile(r"^(\d+)_[A-Za-z0-9_.-]+\.sql$")

SqlRoot = Traversable | Path


class MigrationError(Exception):
    """Migrating failed or the database disagrees with the files; the message says which file."""


class SqlFile(msgspec.Struct, frozen=True):
    path: str  # relative to the SQL dir, e.g. "migrations/0001_init.sql"
    checksum: str
    sql: str
    version: int | None = None  # migrations only

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


class MigrateReport(msgspec.Struct, frozen=True):
    applied: list[str]  # migration file names applied by this run, in order
    repeatables_applied: bool  # whether functions/views were (re-)applied
    repeatables: list[str] = []  # the repeatable paths applied, if any


class SchemaStatus(msgspec.Struct, frozen=True):
    applied: list[str]  # names of applied migrations (from the database), by version
    pending: list[str]  # migration files not yet applied, by version
    mismatched: list[str]  # applied migrations whose file's checksum differs
    missing: list[str]  # applied migrations with no file any more
    repeatables_stale: list[str]  # repeatable paths new/changed/removed since last applied

    @property
    def current(self) -> bool:
        return not (self.pending or self.mismatched or self.missing or self.repeatables_stale)


# --------------------------------------------------------------------------------------------
# Files


def _read(entry: Traversable | Path, rel: str, version: int | None = None) -> SqlFile:
    data = entry.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MigrationError(f"sql/{rel}: not valid UTF-8 ({exc})") from None
    return SqlFile(path=rel, checksum=hashlib.sha256(data).hexdigest(), sql=text, version=version)


def _sql_entries(root: SqlRoot, sub: str) -> list[Traversable | Path]:
    folder = root / sub
    if not folder.is_dir():
        return []
    entries = [e for e in folder.iterdir() if e.is_file() and e.name.endswith(".sql")]
    return sorted(entries, key=lambda e: e.name)


def load_migrations(root: SqlRoot | None = None) -> list[SqlFile]:
    root = sql_dir() if root is None else root
    found: dict[int, SqlFile] = {}
    for entry in _sql_entries(root, "migrations"):
        rel = f"migrations/{entry.name}"
        m = _MIGRATION_NAME.match(entry.name)
        if m is None:
            raise MigrationError(f"sql/{rel}: migration file names must look like 0001_name.sql")
        version = int(m.group(1))
        if version in found:
            raise MigrationError(
                f"sql/{rel}: version {version} also used by sql/{found[version].path}"
            )
        found[version] = _read(entry, rel, version)
    return [found[v] for v in sorted(found)]


def load_repeatables(root: SqlRoot | None = None) -> list[SqlFile]:
    root = sql_dir() if root is None else root
    return [
        _read(entry, f"{sub}/{entry.name}")
        for sub in ("functions", "views")
        for entry in _sql_entries(root, sub)
    ]


# --------------------------------------------------------------------------------------------
# Database


async def _bookkeeping_exists(conn: asyncpg.Connection) -> bool:
    found = await conn.fetchval(query("migrate_bookkeeping_exists"))
    return bool(found)


async def _recorded(
    conn: asyncpg.Connection,
) -> tuple[dict[int, tuple[str, str]], dict[str, str]]:
    if not await _bookkeeping_exists(conn):
        return {}, {}
    migrations = {
        r["version"]: (r["name"], r["checksum"])
        for r in await conn.fetch(query("migrate_applied_migrations"))
    }
    repeatables = {
        r["path"]: r["checksum"] for r in await conn.fetch(query("migrate_applied_repeatables"))
    }
    return migrations, repeatables


def _compare(
    files: list[SqlFile],
    repeatables: list[SqlFile],
    recorded: dict[int, tuple[str, str]],
    recorded_rep: dict[str, str],
) -> SchemaStatus:
    by_version = {f.version: f for f in files}
    mismatched: list[str] = []
    missing: list[str] = []
    for version in sorted(recorded):
        name, checksum = recorded[version]
        f = by_version.get(version)
        if f is None:
            missing.append(name)
        elif f.checksum != checksum:
            mismatched.append(f.name)
    current_paths = {r.path for r in repeatables}
    stale = [r.path for r in repeatables if recorded_rep.get(r.path) != r.checksum]
    stale += sorted(p for p in recorded_rep if p not in current_paths)
    return SchemaStatus(
        applied=[recorded[v][0] for v in sorted(recorded)],
        pending=[f.name for f in files if f.version not in recorded],
        mismatched=mismatched,
        missing=missing,
        repeatables_stale=stale,
    )


def _error_detail(exc: asyncpg.PostgresError, sql: str) -> str:
    detail = str(exc)
    position = getattr(exc, "position", None)
    if position:
        try:
            line = sql[: int(position)].count("\n") + 1
            detail = f"line {line}: {detail}"
        except ValueError:
            pass
    return detail


async def status(conn: asyncpg.Connection, *, root: SqlRoot | None = None) -> SchemaStatus:
    """Compare the database with the SQL files, without changing anything."""
    files = load_migrations(root)
    repeatables = load_repeatables(root)
    recorded, recorded_rep = await _recorded(conn)
    return _compare(files, repeatables, recorded, recorded_rep)


async def migrate(conn: asyncpg.Connection, *, root: SqlRoot | None = None) -> MigrateReport:
    """Apply pending migrations, then re-apply repeatables if any changed.

    Raises MigrationError (naming the file) on a checksum mismatch, a missing applied file or
    a failing statement; migrations applied before the failure stay applied.
    """
    files = load_migrations(root)
    repeatables = load_repeatables(root)
    if conn.is_in_transaction():
        raise MigrationError("migrate() needs a connection that is not inside a transaction")

    await conn.execute(query("migrate_lock"), LOCK_KEY)
    try:
        await conn.execute(query("migrate_bookkeeping"))
        recorded, recorded_rep = await _recorded(conn)
        state = _compare(files, repeatables, recorded, recorded_rep)
        if state.mismatched:
            names = ", ".join(f"sql/migrations/{n}" for n in state.mismatched)
            raise MigrationError(
                f"{names}: checksum differs from the applied migration "
                "(applied migrations must not be edited; add a new one)"
            )
        if state.missing:
            raise MigrationError(
                f"applied migration {', '.join(state.missing)} has no file in sql/migrations "
                "(is this an older respool than the database?)"
            )

        applied: list[str] = []
        for f in files:
            if f.version in recorded:
                continue
            try:
                async with conn.transaction():
                    await conn.execute(f.sql)
                    await conn.execute(
                        query("migrate_record_migration"),
                        f.version,
                        f.name,
                        f.checksum,
                    )
            except asyncpg.PostgresError as exc:
                raise MigrationError(
                    f"sql/{f.path}: migration failed: {_error_detail(exc, f.sql)}"
                ) from exc
            applied.append(f.name)

        reapplied = bool(state.repeatables_stale)
        if reapplied:
            await _apply_repeatables(conn, repeatables, files)
        return MigrateReport(
            applied=applied,
            repeatables_applied=reapplied,
            repeatables=[r.path for r in repeatables] if reapplied else [],
        )
    finally:
        if not conn.is_closed():
            # On failure here the lock goes away with the session anyway.
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await conn.execute(query("migrate_unlock"), LOCK_KEY)


_CREATE_FUNCTION = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+respool\.(\w+)", re.IGNORECASE
)


def _migration_functions(files: list[SqlFile]) -> list[str]:
    """Names of the respool functions the migrations create: a function file need not repeat
    them (the pre-apply drop keeps them)."""
    return sorted({m.group(1).lower() for f in files for m in _CREATE_FUNCTION.finditer(f.sql)})


async def _apply_repeatables(
    conn: asyncpg.Connection, repeatables: list[SqlFile], files: list[SqlFile]
) -> None:
    async with conn.transaction():
        await conn.execute(query("migrate_drop_views"))
        # CREATE OR REPLACE cannot remove an overload whose signature changed; dropping first can.
        await conn.execute(query("migrate_keep_functions"), ",".join(_migration_functions(files)))
        await conn.execute(query("drop_respool_functions"))
        for r in repeatables:
            try:
                await conn.execute(r.sql)
            except asyncpg.PostgresError as exc:
                raise MigrationError(
                    f"sql/{r.path}: repeatable failed: {_error_detail(exc, r.sql)}"
                ) from exc
        await conn.execute(query("migrate_forget_repeatables"))
        await conn.executemany(
            query("migrate_record_repeatable"),
            [(r.path, r.checksum) for r in repeatables],
        )
