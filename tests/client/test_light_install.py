"""The client stands alone: it imports nothing of the server, so a step whose own code has an
``app`` package (the server's import name) can still use it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Respool", "2"]
