from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from app.db.connect import APP_CLI, connect
from app.db.migrate import (
    MigrationError,
    load_migrations,
    load_repeatables,
    migrate,
    status,
)
from app.db.sqlfiles import sql_dir


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _write_all(root: Path, files: dict[str, str]) -> None:
    """Write each file (path below ``root``: text), in order."""
    for rel, text in files.items():
        _write(root, rel, text)


@pytest.fixture
async def empty_conn(empty_db_url: str) -> asyncpg.Connection:
    c = await connect(empty_db_url, application_name=APP_CLI)
    yield c
    await c.close()


def test_sql_dir_has_migrations() -> None:
    root = sql_dir()
    assert (root / "migrations").is_dir()
    assert load_migrations(), "expected at least one migration file"
    assert [f.version for f in load_migrations()] == sorted(f.version for f in load_migrations())


async def test_migrate_is_idempotent(conn: asyncpg.Connection) -> None:
    # `conn` is a copy of the migrated template: nothing left to do.
    report = await migrate(conn)
    assert report.applied == []
    assert report.repeatables_applied is False
    again = await migrate(conn)
    assert again == report


async def test_status_reports_current(conn: asyncpg.Connection) -> None:
    state = await status(conn)
    assert state.current
    assert state.applied == [f.name for f in load_migrations()]
    assert state.pending == [] and state.mismatched == [] and state.repeatables_stale == []


async def test_fresh_database_migrates_everything(empty_conn: asyncpg.Connection) -> None:
    before = await status(empty_conn)
    assert not before.current
    assert before.applied == []
    assert before.pending == [f.name for f in load_migrations()]
    report = await migrate(empty_conn)
    assert report.applied == before.pending
    assert report.repeatables_applied == bool(load_repeatables())
    assert (await status(empty_conn)).current


async def test_checksum_mismatch_is_reported(conn: asyncpg.Connection) -> None:
    first = load_migrations()[0]
    await conn.execute(
        "UPDATE respool.schema_migrations SET checksum = 'bogus' WHERE version = $1",
        first.version,
    )
    state = await status(conn)
    assert state.mismatched == [first.name]
    assert not state.current
    with pytest.raises(MigrationError, match=first.name):
        await migrate(conn)


async def test_applied_migration_without_file(conn: asyncpg.Connection) -> None:
    await conn.execute(
        "INSERT INTO respool.schema_migrations (version, name, checksum)"
        " VALUES (999999, '999999_future.sql', 'x')"
    )
    state = await status(conn)
    assert state.missing == ["999999_future.sql"]
    assert not state.current
    with pytest.raises(MigrationError, match="999999_future.sql"):
        await migrate(conn)


async def test_concurrent_migrators_serialize(empty_db_url: str) -> None:
    c1 = await connect(empty_db_url, application_name=APP_CLI)
    c2 = await connect(empty_db_url, application_name=APP_CLI)
    try:
        r1, r2 = await asyncio.gather(migrate(c1), migrate(c2))
        names = [f.name for f in load_migrations()]
        assert sorted([r1.applied, r2.applied]) == sorted([[], names])
        assert (await status(c1)).current
    finally:
        await c1.close()
        await c2.close()


async def test_changed_repeatable_is_reapplied(conn: asyncpg.Connection) -> None:
    repeatables = load_repeatables()
    assert repeatables, "expected at least one repeatable file"
    # A stray view: re-applying repeatables drops every view in the schema first.
    await conn.execute("CREATE VIEW respool.stray_view AS SELECT 1 AS x")
    await conn.execute(
        "UPDATE respool.schema_repeatables SET checksum = 'bogus' WHERE path = $1",
        repeatables[0].path,
    )
    state = await status(conn)
    assert state.repeatables_stale == [repeatables[0].path]
    report = await migrate(conn)
    assert report.applied == []
    assert report.repeatables_applied
    assert report.repeatables == [r.path for r in repeatables]
    assert await conn.fetchval("SELECT to_regclass('respool.stray_view')") is None
    assert (await status(conn)).current
    assert (await migrate(conn)).repeatables_applied is False


async def test_new_repeatable_row_missing_is_stale(conn: asyncpg.Connection) -> None:
    await conn.execute("DELETE FROM respool.schema_repeatables")
    assert (await status(conn)).repeatables_stale == [r.path for r in load_repeatables()]
    assert (await migrate(conn)).repeatables_applied


# ---- mechanics, on a private SQL tree -------------------------------------------------------


async def test_private_tree_lifecycle(empty_conn: asyncpg.Connection, tmp_path: Path) -> None:
    _write(tmp_path, "migrations/0001_init.sql", "CREATE SCHEMA IF NOT EXISTS respool;")
    _write(
        tmp_path,
        "migrations/0002_things.sql",
        "CREATE TABLE respool.things (id int PRIMARY KEY, label text);",
    )
    _write(
        tmp_path,
        "functions/010_count.sql",
        "CREATE OR REPLACE FUNCTION respool.thing_count() RETURNS bigint"
        " LANGUAGE sql AS 'SELECT count(*) FROM respool.things';",
    )
    _write(tmp_path, "views/010_v.sql", "CREATE VIEW respool.v AS SELECT id FROM respool.things;")

    report = await migrate(empty_conn, root=tmp_path)
    assert report.applied == ["0001_init.sql", "0002_things.sql"]
    assert report.repeatables == ["functions/010_count.sql", "views/010_v.sql"]
    assert await empty_conn.fetchval("SELECT respool.thing_count()") == 0

    # A view whose columns change: plain CREATE OR REPLACE VIEW would fail; the drop avoids it.
    _write(
        tmp_path,
        "views/010_v.sql",
        "CREATE VIEW respool.v AS SELECT label, id FROM respool.things;",
    )
    _write(tmp_path, "migrations/0003_more.sql", "ALTER TABLE respool.things ADD COLUMN n int;")
    assert (await status(empty_conn, root=tmp_path)).pending == ["0003_more.sql"]
    report = await migrate(empty_conn, root=tmp_path)
    assert report.applied == ["0003_more.sql"]
    assert report.repeatables_applied
    cols = await empty_conn.fetch("SELECT * FROM respool.v")
    assert cols == []
    assert (await status(empty_conn, root=tmp_path)).current

    # Editing an applied file is an error naming the file.
    _write(tmp_path, "migrations/0002_things.sql", "-- edited\n")
    state = await status(empty_conn, root=tmp_path)
    assert state.mismatched == ["0002_things.sql"]
    with pytest.raises(MigrationError, match=r"sql/migrations/0002_things\.sql"):
        await migrate(empty_conn, root=tmp_path)


async def test_failing_migration_names_file_and_rolls_back(
    empty_conn: asyncpg.Connection, tmp_path: Path
) -> None:
    _write_all(
        tmp_path,
        {
            "migrations/0001_ok.sql": "CREATE TABLE respool.ok (id int);",
            "migrations/0002_bad.sql": "CREATE TABLE respool.half (id int);\n"
            "SELECT no_such_column FROM respool.ok;\n",
        },
    )
    with pytest.raises(MigrationError, match=r"sql/migrations/0002_bad\.sql.*line 2") as info:
        await migrate(empty_conn, root=tmp_path)
    assert "\n" not in str(info.value)
    state = await status(empty_conn, root=tmp_path)
    assert state.applied == ["0001_ok.sql"]
    assert state.pending == ["0002_bad.sql"]
    assert await empty_conn.fetchval("SELECT to_regclass('respool.half')") is None
    # The advisory lock was released: another session can take it at once.
    assert await empty_conn.fetchval("SELECT pg_try_advisory_lock(1)")


async def test_failing_repeatable_rolls_back_all(
    empty_conn: asyncpg.Connection, tmp_path: Path
) -> None:
    _write_all(
        tmp_path,
        {
            "migrations/0001_init.sql": "SELECT 1;",
            "functions/010_a.sql": "CREATE OR REPLACE FUNCTION respool.a() RETURNS int"
            " LANGUAGE sql AS 'SELECT 1';",
            "functions/020_b.sql": "CREATE FUNCTION broken(",
        },
    )
    with pytest.raises(MigrationError, match=r"sql/functions/020_b\.sql"):
        await migrate(empty_conn, root=tmp_path)
    assert await empty_conn.fetchval("SELECT to_regprocedure('respool.a()')") is None
    state = await status(empty_conn, root=tmp_path)
    assert state.applied == ["0001_init.sql"]
    assert state.repeatables_stale == ["functions/010_a.sql", "functions/020_b.sql"]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"migrations/init.sql": "SELECT 1;"}, "migrations/init.sql"),
        (
            {"migrations/0001_a.sql": "SELECT 1;", "migrations/001_b.sql": "SELECT 1;"},
            "version 1",
        ),
    ],
)
def test_bad_migration_files(tmp_path: Path, files: dict[str, str], message: str) -> None:
    _write_all(tmp_path, files)
    with pytest.raises(MigrationError, match=message):
        load_migrations(tmp_path)


# ---- stale overloads -------------------------------------------------------------------------


def _copy_sql_tree(dest: Path) -> Path:
    """A writable copy of the shipped SQL tree (migrations, functions, views)."""
    root = sql_dir()
    for sub in ("migrations", "functions", "views"):
        folder = root / sub
        for entry in folder.iterdir():
            if entry.name.endswith(".sql"):
                _write(dest, f"{sub}/{entry.name}", entry.read_text(encoding="utf-8"))
    return dest


async def test_changed_signature_leaves_no_stale_overload(
    conn: asyncpg.Connection, tmp_path: Path
) -> None:
    root = _copy_sql_tree(tmp_path)
    path = root / "functions/020_refs.sql"
    text = path.read_text()
    old = "CREATE OR REPLACE FUNCTION respool.resolve_pool(p_ref text)"
    assert old in text
    # Add a defaulted parameter: CREATE OR REPLACE alone would leave resolve_pool(text) behind
    # and a named call would then fail with "function respool.resolve_pool(...) is not unique".
    path.write_text(
        text.replace(
            old,
            "CREATE OR REPLACE FUNCTION respool.resolve_pool(p_ref text, p_extra int DEFAULT 0)",
        ).replace(
            "COMMENT ON FUNCTION respool.resolve_pool(text)",
            "COMMENT ON FUNCTION respool.resolve_pool(text, int)",
        )
    )
    await conn.execute("SELECT respool.create_pool(p_name => 'gpus')")
    report = await migrate(conn, root=root)
    assert report.repeatables_applied
    overloads = await conn.fetch(
        "SELECT p.oid::regprocedure::text AS sig FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'respool' AND p.proname = 'resolve_pool'"
    )
    assert [r["sig"] for r in overloads] == ["respool.resolve_pool(text,integer)"]
    pool_id = await conn.fetchval("SELECT respool.resolve_pool(p_ref => 'gpus')")
    assert pool_id == await conn.fetchval("SELECT id FROM respool.pools WHERE name = 'gpus'")
    # Functions a migration object needs stay: the append-only trigger on events still fires.
    assert (
        await conn.fetchval("SELECT to_regprocedure('respool.forbid_event_update()')") is not None
    )
    trigger = await conn.fetchval(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'events_append_only' AND NOT tgisinternal"
    )
    assert trigger == 1
    # And the rest of the engine is back: a request goes through the re-created functions.
    doc = await conn.fetchval(
        "SELECT respool.create_policy(p_subject => 's', p_pool => 'gpus', p_limit => '{\"x\": 1}')"
    )
    assert doc["subject"] == "s"
    # Back to the shipped files: the extra overload goes again.
    await migrate(conn)
    assert (
        await conn.fetchval("SELECT to_regprocedure('respool.resolve_pool(text,integer)')") is None
    )
    assert await conn.fetchval("SELECT respool.resolve_pool(p_ref => 'gpus')") == pool_id


async def test_functions_of_migrations_survive_a_reapply(conn: asyncpg.Connection) -> None:
    """reader_role() is created by migration 0010 only (no function file repeats it): the drop
    before the function files are re-applied must keep it, and its callers keep working."""
    assert not any("FUNCTION respool.reader_role(" in r.sql for r in load_repeatables())
    await conn.execute("DELETE FROM respool.schema_repeatables")  # every repeatable is stale now
    report = await migrate(conn)
    assert report.repeatables_applied
    assert (await conn.fetchval("SELECT respool.reader_role()")).startswith("respool_reader_")
    assert await conn.fetchval("SELECT to_regprocedure('respool.scope_reader_grants(boolean)')")
