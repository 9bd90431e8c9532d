"""CMD's process group under ``respool run``: started in a session of its own, signalled as a
whole, and known to be gone only when no process of it is left.

So that no process of the group outlives the wrapper, even when the wrapper is SIGKILLed:

* CMD gets a parent-death signal (``PR_SET_PDEATHSIG`` = SIGKILL, Linux);
* a guard process (:mod:`respool_client._guard`) SIGKILLs the whole group when the wrapper's
  end of a pipe closes without the wrapper saying ``done``;
* the wrapper is a child subreaper (Linux), so the orphans of the group become its children and
  it reaps them: an orphan that exited never looks alive as a zombie.

Processes that leave the group (``setsid``, ``setpgid``: daemons) are not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["ProcessGroup"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_GUARD = Path(__file__).with_name("_guard.py")


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


def _die_with(parent: int, prctl: Callable[..., int]) -> Callable[[], None]:
    """A pre-exec for CMD: SIGKILL when its parent (the wrapper) dies; exit at once if it
    already died before the signal was armed."""

    def pre_exec() -> None:
        prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # 9: SIGKILL
        if os.getppid() != parent:
            os._exit(137)

    return pre_exec


class ProcessGroup:
    """CMD, the leader of its own process group, and the guard of that group."""

    def __init__(self, proc: asyncio.subprocess.Process, guard: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pgid = proc.pid
        self._guard = guard

    @classmethod
    async def start(
        cls,
        cmd: list[str],
        env: Mapping[str, str],
        cwd: str | None = None,
        capture: bool = False,
    ) -> ProcessGroup:
        """Start ``cmd`` in a new session (its pid is the group id), guarded, in ``cwd``
        (default: ours), its stdout and stderr pipes when ``capture`` (else ours); ``OSError``
        when it cannot be run."""
        prctl = _prctl()
        if prctl is not None:
            prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        # Our own stdlib script by the running interpreter; it starts in milliseconds.
        guard = subprocess.Popen(  # noqa: ASYNC220, S603
            [sys.executable, "-I", "-S", str(_GUARD)],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                env=dict(env),
                start_new_session=True,
                cwd=cwd,
                stdin=subprocess.DEVNULL if capture else None,
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.PIPE if capture else None,
                preexec_fn=None if prctl is None else _die_with(os.getpid(), prctl),
            )
        except BaseException:
            _close_guard(guard, b"")
            raise
        assert guard.stdin is not None
        guard.stdin.write(f"{proc.pid}\n".encode())
        guard.stdin.flush()
        return cls(proc, guard)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process of the group (nothing if it is gone)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def alive(self) -> bool:
        """Whether any process of the group is left. Once the leader was waited for, the
        group's orphans that exited (our children, as subreaper) are reaped first."""
        if self.proc.returncode is not None:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-self.pgid, os.WNOHANG)[0]:
                    pass
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def close(self) -> None:
        """Let the guard go: without killing when the group is gone; else (the wrapper is
        leaving on an unexpected error) the guard SIGKILLs what is left of the group."""
        _close_guard(self._guard, b"" if self.alive() else b"done\n", wait=False)


def _close_guard(guard: subprocess.Popen[bytes], last: bytes, *, wait: bool = True) -> None:
    """Tell the guard ``last`` and close its pipe; reap it now, or (``wait`` False) from a
    thread of its own: the guard may still be starting, and an agent's loop runs other jobs."""
    assert guard.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        if last:
            guard.stdin.write(last)
        guard.stdin.close()
    if wait:
        guard.wait()
    elif guard.poll() is None:
        threading.Thread(target=guard.wait, name="respool-guard-reaper", daemon=True).start()
