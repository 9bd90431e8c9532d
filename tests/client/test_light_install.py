"""The client stands alone: it imports nothing of the server, so a step whose own code has an
``app`` package (the server's import name) can still use it."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

from support.proc import run_python

_PROBE = textwrap.dedent(
    """
    import sys
    import respool_client
    from respool_client import Respool, ResourceSettings, wire
    assert "app" not in sys.modules and "cli" not in sys.modules, sorted(sys.modules)
    import app
    assert app.OWNER == "the user's step", app.__file__
    body = wire.RequestCreate(subject="s", settings=ResourceSettings(gpu_count=2))
    print(Respool.__name__, body.settings.gpu_count)
    """
)


def test_imports_next_to_a_package_named_app(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text('OWNER = "the user\'s step"\n')
    (tmp_path / "cli.py").write_text('raise SystemExit("the user\'s cli module was imported")\n')
    done = run_python("-c", _PROBE, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Respool", "2"]


# ``respool`` (respool_client.cli) run as the console script runs it, with sys.argv.
_SCRIPT = "import sys; sys.argv[0] = 'respool'; from respool_client.cli import main; main()"


def _respool(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _shadow_server(tmp_path: Path, entry_points: str | None) -> None:
    """A distribution named ``respool`` ahead of the installed one on sys.path (the working
    directory comes first), registering ``entry_points`` (or nothing)."""
    info = tmp_path / "respool-99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: respool\nVersion: 99.0\n")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)


def test_the_server_cli_is_the_one_its_distribution_registers(tmp_path: Path) -> None:
    # The light client finds the server's commands through the entry point the server's
    # distribution registers, not by importing a module named cli.
    _shadow_server(tmp_path, "[respool.cli]\nmain = other_server:main\n")
    (tmp_path / "other_server.py").write_text(
        "import sys\ndef main():\n    print('other server:', *sys.argv[1:])\n"
    )
    done = _respool(tmp_path, "pool", "list")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "other server: pool list"


def test_without_a_registered_server_cli_other_commands_say_what_to_install(
    tmp_path: Path,
) -> None:
    _shadow_server(tmp_path, None)  # a `respool` distribution that registers no CLI
    done = _respool(tmp_path, "pool", "list")
    assert done.returncode == 2
    assert "install the respool server CLI for `respool pool`" in done.stderr
    assert "light client" in done.stderr
    usage = _respool(tmp_path, "--help")
    assert usage.returncode == 0, usage.stderr
    assert "usage: respool run" in usage.stdout
    # `respool run` is the light client's own, with or without the server.
    run = _respool(tmp_path, "run", "--help")
    assert run.returncode == 0, run.stderr
    assert "usage:" in run.stdout


def test_the_installed_server_registers_its_cli() -> None:
    from respool_client.cli import SERVER_CLI_GROUP

    (entry,) = importlib.metadata.entry_points(group=SERVER_CLI_GROUP, name="main")
    assert entry.dist is not None and entry.dist.name == "respool"
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, "db", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "migrate" in done.stdout
