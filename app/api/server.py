"""uvicorn for the API: SIGTERM/SIGINT also answer every open long-poll at once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

import uvicorn
from litestar import Litestar

from app.notify import Notifier

__all__ = ["ApiServer"]


class ApiServer(uvicorn.Server):
    """uvicorn, plus: on SIGTERM/SIGINT answer every open long-poll at once (SPEC §6), so the
    graceful shutdown does not wait for waits to time out."""

    def __init__(self, config: uvicorn.Config, app: Litestar) -> None:
        super().__init__(config)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, except that a SIGTERM is not raised again after the graceful shutdown.

        Raised again with its default action, it would kill the process before the ``atexit``
        handlers run, and the embedded PostgreSQL (stopped by one of them) would be left running.
        The process exits normally (status 0) instead. SIGINT is still raised again.
        """
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals[:] = [
                    s for s in self._captured_signals if s != signal.SIGTERM
                ]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        notifier: Notifier = self._app.state.notifier
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(notifier.begin_shutdown)
