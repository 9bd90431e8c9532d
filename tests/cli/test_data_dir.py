"""``RESPOOL_DATA_DIR``: where the embedded PostgreSQL keeps its data (README, Configuration)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db.embedded import embedded_server_running, start_embedded_server
from app.settings import Settings
from support.proc import run_python


def respool(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_python("-m", "cli.main", *args, env=env, cwd=cwd, timeout=180)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory of the test's own, outside pytest's base directory: run as root, the embedded
    server runs as another user, and any pytest session that starts makes pytest's base
    directory 0700 again, which that user could then no longer traverse."""
    with tempfile.TemporaryDirectory(prefix="respool-data-dir-") as where:
        yield Path(where)


@pytest.fixture
def dirs(base: Path) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """A data directory chosen by RESPOOL_DATA_DIR (given relative to the working directory),
    and a user data directory (XDG_DATA_HOME) that must stay unused; the server is stopped and
    deleted afterwards."""
    chosen, xdg = base / "srv" / "respool-data", base / "xdg"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPOOL_")}
    env |= {"RESPOOL_DATA_DIR": "srv/respool-data", "XDG_DATA_HOME": str(xdg)}
    try:
        yield chosen, xdg, env
    finally:
        for pgdata in (chosen / "pgdata", xdg / "respool" / "pgdata"):
            if embedded_server_running(pgdata):
                start_embedded_server(pgdata, cleanup_mode="delete").cleanup()


def test_respool_data_dir_sets_where_the_embedded_server_keeps_its_data(
    dirs: tuple[Path, Path, dict[str, str]], base: Path
) -> None:
    chosen, xdg, env = dirs
    done = respool("db", "url", env=env, cwd=base)
    assert done.returncode == 0, done.stderr
    assert f"using embedded PostgreSQL, data in {chosen / 'pgdata'}" in done.stderr
    assert embedded_server_running(chosen / "pgdata")
    assert (chosen / "pgdata" / "PG_VERSION").is_file()
    assert not (xdg / "respool").exists()  # the user data directory was not used
    # The next command, from another directory, finds the same server through the variable.
    env_abs = env | {"RESPOOL_DATA_DIR": str(chosen)}
    again = respool("db", "url", env=env_abs, cwd=Path("/"))
    assert again.returncode == 0, again.stderr
    assert again.stdout == done.stdout


def test_respool_data_dir_setting() -> None:
    assert Settings.from_env({}).data_dir is None
    home = Path.home()
    assert Settings.from_env({"RESPOOL_DATA_DIR": "~/rp"}).data_dir == str(home / "rp")
    assert Settings.from_env({"RESPOOL_DATA_DIR": " "}).data_dir is None
