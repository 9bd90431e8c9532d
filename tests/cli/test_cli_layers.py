"""The commands that talk to the API need nothing of the server package (``app``): only the
database commands (db, token, serve, reconcile) and apply's manifest import it."""

from __future__ import annotations

import subprocess
import sys

HTTP_MODULES = [
    "cli.api",
    "cli.common",
    "cli.fetch",
    "cli.group",
    "cli.options",
    "cli.output",
    "cli.policy",
    "cli.pool",
    "cli.request",
    "cli.request_options",
    "cli.run",
    "cli.tables",
    "cli.wait",
]


def test_http_commands_import_nothing_of_app() -> None:
    code = (
        f"import sys\nfor m in {HTTP_MODULES!r}: __import__(m)\n"
        "print(sorted(m for m in sys.modules if m == 'app' or m.startswith('app.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
