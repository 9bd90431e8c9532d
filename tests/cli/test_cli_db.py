"""``respool db url`` and ``respool db shell``: ops reach the database the service uses, the
embedded server included, as real processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from typer.testing import CliRunner

from app.db.embedded import embedded_server_running, start_embedded_server
from cli.main import app
from support.cli import failed
from support.proc import run_python

PSQL = shutil.which("psql")
needs_psql = pytest.mark.skipif(PSQL is None, reason="psql is not on PATH")

SECRET = "s3cr%40t"  # "s3cr@t", percent-encoded as a URI requires


def respool(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run_python("-m", "cli.main", *args, env=env, timeout=timeout)


def service_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPOOL_")}
    return env | extra


# --- db url: the DSN, password masked -------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        (
            f"postgresql://alice:{SECRET}@db.example:5432/respool?sslmode=require",
            "postgresql://alice:***@db.example:5432/respool?sslmode=require",
        ),
        (
            "postgresql://alice@db.example/respool?password=s3cret&sslmode=require",
            "postgresql://alice@db.example/respool?password=***&sslmode=require",
        ),
        ("postgresql://alice@db.example/respool", "postgresql://alice@db.example/respool"),
        (
            "host=db.example password=s3cret dbname=respool",
            "host=db.example password=*** dbname=respool",
        ),
    ],
)
def test_db_url_prints_the_configured_url_with_the_password_masked(dsn: str, masked: str) -> None:
    runner = CliRunner()
    env = {"RESPOOL_DATABASE_URL": dsn}
    shown = runner.invoke(app, ["db", "url"], env=env)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == masked + "\n"
    whole = runner.invoke(app, ["db", "url", "--show-password"], env=env)
    assert whole.exit_code == 0, whole.output
    assert whole.stdout == dsn + "\n"


# --- db shell on a configured database ------------------------------------------------------


@needs_psql
async def test_db_shell_runs_psql_on_the_service_database(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        for pool in ("zeta", "alpha"):
            await conn.execute(
                "SELECT respool.create_pool(p_name => $1, p_capacity => '{\"gpu\": 2}')", pool
            )
    finally:
        await conn.close()
    sql = "SELECT pool, key, capacity FROM respool.pool_usage"
    done = await asyncio.to_thread(
        respool, "db", "shell", "--", "-At", "-c", sql, env=service_env(RESPOOL_DATABASE_URL=db_url)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["alpha|gpu|2", "zeta|gpu|2"]


@needs_psql
async def test_db_shell_exits_with_psqls_code(db_url: str) -> None:
    done = await asyncio.to_thread(
        respool,
        "db",
        "shell",
        "--",
        "-c",
        "SELECT nope",
        env=service_env(RESPOOL_DATABASE_URL=db_url),
    )
    assert done.returncode == 1
    assert 'column "nope" does not exist' in done.stderr
    assert "Traceback" not in done.stderr


def test_db_shell_gives_psql_the_password_in_its_environment(tmp_path: Path) -> None:
    """Not on psql's command line, which every local user can read in ps."""
    fake = tmp_path / "psql"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\nprintf "PGPASSWORD=%s\\n" "$PGPASSWORD"\n')
    fake.chmod(0o755)
    dsn = f"postgresql://alice:{SECRET}@db.example:5432/respool?sslmode=require"
    env = service_env(RESPOOL_DATABASE_URL=dsn, PATH=str(tmp_path))
    done = respool("db", "shell", "--", "-c", "SELECT 1", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "--dbname",
        "postgresql://alice@db.example:5432/respool?sslmode=require",
        "-c",
        "SELECT 1",
        "PGPASSWORD=s3cr@t",
    ]


def test_db_shell_without_psql_says_so_and_gives_the_url(tmp_path: Path) -> None:
    env = {
        "RESPOOL_DATABASE_URL": f"postgresql://alice:{SECRET}@db.example/respool",
        "PATH": str(tmp_path),
    }
    result = CliRunner().invoke(app, ["db", "shell"], env=env)
    message = failed(result)
    assert message.startswith("psql is not on PATH")
    assert "postgresql://alice:***@db.example/respool" in message
    assert SECRET not in message and "--show-password" in message


# --- the embedded server --------------------------------------------------------------------


@pytest.fixture
def embedded_home(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A user data directory of this test's own (so the embedded server's data directory, with
    no RESPOOL_DATABASE_URL); its server is stopped and deleted afterwards."""
    pgdata = tmp_path / "respool" / "pgdata"
    try:
        yield pgdata, service_env(XDG_DATA_HOME=str(tmp_path))
    finally:
        if embedded_server_running(pgdata):
            start_embedded_server(pgdata, cleanup_mode="delete").cleanup()


def _current_database(url: str) -> str:
    async def ask() -> str:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            return str(await conn.fetchval("SELECT current_database()"))
        finally:
            await conn.close()

    return asyncio.run(ask())


def test_db_url_starts_the_embedded_server_and_leaves_it_running(
    embedded_home: tuple[Path, dict[str, str]],
) -> None:
    pgdata, env = embedded_home
    assert not embedded_server_running(pgdata)
    first = respool("db", "url", env=env)
    assert first.returncode == 0, first.stderr
    url = first.stdout.strip()
    assert url.startswith("postgresql://postgres:@/respool?host=") and "\n" not in url
    assert f"using embedded PostgreSQL, data in {pgdata}" in first.stderr
    # The URL works after the command has exited: the server it started keeps running.
    assert embedded_server_running(pgdata)
    assert _current_database(url) == "respool"
    # Another command that uses the server does not stop what it did not start.
    migrated = respool("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert embedded_server_running(pgdata)
    again = respool("db", "url", "--show-password", env=env)
    assert again.returncode == 0 and again.stdout.strip() == url


@needs_psql
def test_db_shell_on_the_embedded_server(embedded_home: tuple[Path, dict[str, str]]) -> None:
    pgdata, env = embedded_home
    migrated = respool("db", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert not embedded_server_running(pgdata)  # migrate started it, and stopped it
    done = respool("db", "shell", "--", "-At", "-c", "SELECT count(*) FROM respool.pools", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0\n"
    # The shell started the server for psql only: it stops with it.
    assert not embedded_server_running(pgdata)


def test_db_shell_without_psql_leaves_the_embedded_server_running_for_the_url(
    embedded_home: tuple[Path, dict[str, str]],
) -> None:
    pgdata, env = embedded_home
    bin_dir = pgdata.parent.parent / "bin"
    bin_dir.mkdir()
    done = respool("db", "shell", env=env | {"PATH": str(bin_dir)})
    assert done.returncode == 1 and done.stdout == ""
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: psql is not on PATH") and "Traceback" not in done.stderr
    url = line.rsplit(" ", 1)[1]
    assert url.startswith("postgresql://postgres:@/respool?host=")
    assert _current_database(url) == "respool"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_db_shell_leaves_nothing_when_its_terminal_closes_or_it_is_killed(
    embedded_home: tuple[Path, dict[str, str]], sig: signal.Signals
) -> None:
    """A closed terminal (SIGHUP) or a kill (SIGTERM) of `respool db shell`: no psql left, and
    the embedded server it started for psql stops, as on a normal exit."""
    pgdata, env = embedded_home
    bin_dir = pgdata.parent.parent / "bin"
    bin_dir.mkdir()
    pid_file = bin_dir / "psql.pid"
    fake = bin_dir / "psql"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 120\n")
    fake.chmod(0o755)
    with subprocess.Popen(
        [sys.executable, "-m", "cli.main", "db", "shell"],
        env=env | {"PATH": f"{bin_dir}:/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as shell:
        try:
            deadline = time.monotonic() + 60
            while not pid_file.exists() or not pid_file.read_text().strip():
                assert shell.poll() is None, shell.stderr.read() if shell.stderr else ""
                assert time.monotonic() < deadline, "psql never started"
                time.sleep(0.05)
            psql_pid = int(pid_file.read_text())
            assert embedded_server_running(pgdata)
            shell.send_signal(sig)
            assert shell.wait(timeout=60) == 128 + sig
        finally:
            if shell.poll() is None:
                shell.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(psql_pid, 0)
    assert not embedded_server_running(pgdata)
