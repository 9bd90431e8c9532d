"""The launcher seam: how ``respool run`` and ``respool agent`` start a command and stop it
(``docs/jobs.md``, "The launcher seam").

Everything else about running a command under a grant (the environment, heartbeats, the
preemption notice → SIGTERM → grace → SIGKILL, release once the command is gone, requeues) is
:mod:`respool_client.run`'s, whatever the launcher. A launcher only has to:

* ``start(argv, env, workdir, on_output)`` → a :class:`Launched` handle (``OSError`` when the
  command cannot be started: the caller records why);
* ``handle.signal(sig)``: send ``sig`` to everything the command started (a process group here;
  a pod's containers for a Kubernetes launcher);
* ``handle.wait()``: the command's exit status (``-N`` when signal N ended it);
* ``handle.alive()``: whether anything of it is left (the release waits until it is not);
* ``on_output(stream, data)``: called with each piece of stdout / stderr when given (else the
  command writes to our own stdout and stderr);
* ``handle.close()``: let it go; whatever is left of it is killed.

:class:`LocalLauncher` runs the command on this machine as a process group of its own
(:mod:`respool_client._group`), as the agent's OS user.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol

from respool_client._group import ProcessGroup

__all__ = ["Launched", "Launcher", "LocalLauncher", "OnOutput", "Stream"]

Stream = Literal["stdout", "stderr"]
OnOutput = Callable[[Stream, bytes], None]
READ_SIZE = 65536


class Launched(Protocol):
    """A started command (see the module)."""

    @property
    def returncode(self) -> int | None: ...

    def signal(self, sig: int) -> None: ...

    async def wait(self) -> int: ...

    def alive(self) -> bool: ...

    async def drained(self, within: float) -> None: ...

    def close(self) -> None: ...


class Launcher(Protocol):
    async def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        workdir: str | None = None,
        on_output: OnOutput | None = None,
    ) -> Launched: ...


class LocalProcess:
    """A :class:`Launched` command running here, as a process group of its own."""

    def __init__(self, group: ProcessGroup, readers: list[asyncio.Task[None]]) -> None:
        self.group = group
        self._readers = readers

    @property
    def returncode(self) -> int | None:
        return self.group.proc.returncode

    @property
    def pgid(self) -> int:
        """Its process group: what ``respool run`` measures the GPU memory of."""
        return self.group.pgid

    def signal(self, sig: int) -> None:
        self.group.signal(sig)

    async def wait(self) -> int:
        return await self.group.proc.wait()

    def alive(self) -> bool:
        return self.group.alive()

    async def drained(self, within: float) -> None:
        """Until the output pipes reached their end (a process that left the group may hold
        them open: at most ``within`` seconds)."""
        if self._readers:
            await asyncio.wait(self._readers, timeout=within)

    def close(self) -> None:
        for reader in self._readers:
            reader.cancel()
        self.group.close()


class LocalLauncher:
    """Start commands on this machine (:class:`LocalProcess`)."""

    async def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        workdir: str | None = None,
        on_output: OnOutput | None = None,
    ) -> LocalProcess:
        group = await ProcessGroup.start(
            list(argv), env, cwd=workdir, capture=on_output is not None
        )
        readers: list[asyncio.Task[None]] = []
        if on_output is not None:
            proc = group.proc
            for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                if pipe is not None:
                    readers.append(asyncio.create_task(_pump(pipe, name, on_output)))  # type: ignore[arg-type]
        return LocalProcess(group, readers)


async def _pump(pipe: asyncio.StreamReader, stream: Stream, on_output: OnOutput) -> None:
    with contextlib.suppress(OSError, ValueError):
        while data := await pipe.read(READ_SIZE):
            on_output(stream, data)
