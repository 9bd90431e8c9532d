"""Child processes of the tests: run to the end, output captured as text."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["run", "run_python"]


def run(argv: Sequence[str], *, timeout: float, **options: Any) -> subprocess.CompletedProcess[str]:
    """``argv`` to its end (at most ``timeout`` seconds), stdout and stderr captured as text;
    its exit status is the caller's to check. ``options``: :func:`subprocess.run`'s (env, cwd)."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, **options
    )


def run_python(*args: str, timeout: float, **options: Any) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``args`` (:func:`run`)."""
    return run([sys.executable, *args], timeout=timeout, **options)
