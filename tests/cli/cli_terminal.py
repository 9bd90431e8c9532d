"""``respool`` in a real terminal: a child process whose stdout is a pty of a given size
(``TIOCSWINSZ``), as a person at an 80- or 120-column terminal runs it, or a pipe.

Not a test module (no ``test_`` prefix): the helpers of tests/cli/test_cli_terminal.py.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Run", "in_pipe", "in_terminal", "plain"]

ROOT = Path(__file__).resolve().parents[2]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_DROPPED = ("COLUMNS", "LINES", "RESPOOL_URL", "RESPOOL_TOKEN", "NO_COLOR", "FORCE_COLOR")


@dataclass
class Run:
    code: int
    stdout: str  # as the terminal (or pipe) received it, style codes removed
    stderr: str


def plain(text: str) -> str:
    """``text`` without style codes, with the terminal's CR LF as LF."""
    return _ANSI.sub("", text).replace("\r\n", "\n")


def _environ(env: dict[str, str] | None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    environ["TERM"] = "xterm-256color"
    environ["PYTHONPATH"] = str(ROOT)
    return environ | (env or {})


def in_terminal(
    *args: str, columns: int, env: dict[str, str] | None = None, timeout: float = 60.0
) -> Run:
    """``respool ARGS`` with stdout on a pty of ``columns`` x 50 (stderr a pipe)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=_environ(env),
        cwd=ROOT,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[1]
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = b"".join(chunks).decode()
    return Run(proc.returncode, plain(out), stderr.decode())


def in_pipe(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> Run:
    """``respool ARGS`` with stdout and stderr on pipes (a script, ``| less``, a CI log)."""
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=_environ(env),
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    return Run(done.returncode, done.stdout.decode(), done.stderr.decode())
