"""Child processes of the tests: run to the end, output captured as text; or stopped."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["run", "run_python", "stop"]


def run(argv: Sequence[str], *, timeout: float, **options: Any) -> subprocess.CompletedProcess[str]:
    """``argv`` to its end (at most ``timeout`` seconds), stdout and stderr captured as text;
    its exit status is the caller's to check. ``options``: :func:`subprocess.run`'s (env, cwd)."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, **options
    )


def run_python(*args: str, timeout: float, **options: Any) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``args`` (:func:`run`)."""
    return run([sys.executable, *args], timeout=timeout, **options)


async def stop(proc: asyncio.subprocess.Process) -> int:
    """SIGTERM ``proc`` unless it has ended, SIGKILL it if it has not ended 30 s later; its exit
    code."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode
