"""What ``respool run`` tells its user on stderr, from the moment it asks.

On a terminal, while it waits for the grant, one live line rewritten in place (the queue
position, what the request waits for, the ETA and the time waited; or, while the API does not
answer, what failed and how long it keeps trying), cut to the terminal's width. Otherwise, and
for everything said while CMD runs, one line per change, each starting with ``respool:``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from typing import TextIO

from respool_client._transport import Retrying
from respool_client.wire import Eta, Request

__all__ = ["Status", "fmt_eta"]

CLEAR = "\r\x1b[2K"  # back to the start of the line, erase it
TICK = 1.0  # seconds between redraws of the live line


def fmt_eta(eta: Eta | None) -> str:
    """``ETA ~2m (90%: within 5m)``, or that there is none (too few recorded holds in the
    pool, or too deep in the queue: docs/scheduling.md)."""
    if eta is None:
        return "ETA unknown (too few recorded holds, or too deep in the queue)"
    return f"ETA ~{_secs(eta.p50_seconds)} (90%: within {_secs(eta.p90_seconds)})"


def _secs(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{round(seconds / 60)}m"
    return f"{seconds / 3600:.1f}h"


class Status:
    """The wrapper's status lines (see the module). ``live``: draw a live line (default: ``out``
    is a terminal and ``TERM`` is not ``dumb``); ``clock``: monotonic seconds."""

    def __init__(
        self,
        out: TextIO,
        *,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        if live is None:
            live = out.isatty() and os.environ.get("TERM") != "dumb"
        self.live = live
        self.clock = clock
        self.since = clock()  # when the current wait began
        self.running = False  # CMD runs: no live line (CMD writes to the terminal too)
        self.lease_left: Callable[[], float | None] = lambda: None  # while CMD runs
        self._waiting: Request | None = None  # the last queued state seen
        self._late: str | None = None  # the URL that has not answered the first call yet
        self._trouble: dict[str, tuple[Retrying, float]] = {}  # failed calls, and when
        self._said_wait: str | None = None  # the last waiting line printed (not live)
        self._said_trouble: str | None = None  # the last problem printed (not live)
        self._drawn = False  # a live line is on the screen

    @property
    def troubled(self) -> bool:
        """A call is failing (and being retried) right now."""
        return bool(self._trouble)

    # --- what happened ---

    def asking(self) -> None:
        """A new wait for a grant begins (the request is being created, or was requeued)."""
        self.since = self.clock()
        self.running = False
        self._waiting = None
        self._said_wait = None

    def holding(self, lease_left: Callable[[], float | None]) -> None:
        """CMD runs; ``lease_left``: seconds until the lease ends unless renewed (None: no
        lease)."""
        self._erase()
        self.running = True
        self.lease_left = lease_left

    def waiting(self, state: Request) -> None:
        """The request is queued in ``state``."""
        self._waiting = state
        self._late = None
        if self._is_live():
            self._draw()
            return
        line = self._wait_text(state, with_time=False)
        if line != self._said_wait:
            self._said_wait = line
            self._print(line)

    def no_answer_yet(self, url: str) -> None:
        """The first call has had no answer (and no failure) for a while."""
        if self._trouble or self._waiting is not None:
            return
        self._late = url
        if self._is_live():
            self._draw()
        else:
            self._print(self._late_text(url))

    def retrying(self, notice: Retrying) -> None:
        """A call failed and is retried (:class:`~respool_client._transport.RetryListener`)."""
        self._trouble[f"{notice.method} {notice.path}"] = (notice, self.clock())
        self._late = None
        if self._is_live():
            self._draw()
        elif notice.problem != self._said_trouble:
            self._said_trouble = notice.problem
            self._print(self._trouble_text(notice, notice.left))

    def answered(self) -> None:
        """A call got an answer after failed tries."""
        if not self._trouble:
            return
        self._trouble.clear()
        if self._is_live():
            self._draw()
        elif self._said_trouble is not None:
            self._print(f"the API answers again (it was: {self._said_trouble})")
            self._said_trouble = None

    def say(self, text: str) -> None:
        """A line that stays: ``respool: text``."""
        self._print(text)

    async def tick(self) -> None:
        """Redraw the live line every second (the time waited, the seconds left); run it as a
        task while the wrapper may wait on a terminal."""
        while True:
            await asyncio.sleep(TICK)
            if self._is_live() and self._drawn:
                self._draw()

    # --- the words ---

    def _wait_text(self, state: Request, *, with_time: bool) -> str:
        """One line per change: ``request ID attempt N: #1 in queue: why; ETA``; live, what
        changes first and the request last: ``#1 in queue for 12s: why; ETA; request ID``."""
        where = f"#{state.queue_position} in queue" if state.queue_position else "queued"
        why = f": {state.message}" if state.message else ""
        eta = fmt_eta(state.eta)
        request = f"request {state.id} attempt {state.attempt}"
        if with_time:
            waited = _secs(self.clock() - self.since)
            return f"{where} for {waited}{why}; {eta}; {request}"
        return f"{request}: {where}{why}; {eta}"

    def _late_text(self, url: str) -> str:
        return f"no answer from {url} yet ({_secs(self.clock() - self.since)}); still waiting"

    def _trouble_text(self, notice: Retrying, left: float) -> str:
        if not self.running:
            return f"{notice.problem}; retrying, {_secs(left)} left"
        lease = self.lease_left()
        if lease is None:
            return f"{notice.problem}; retrying; CMD keeps running"
        return f"{notice.problem}; retrying; CMD keeps running, lease ends in {_secs(lease)}"

    # --- the terminal ---

    def _is_live(self) -> bool:
        return self.live and not self.running

    def _line(self) -> str | None:
        if self._trouble:  # the call that keeps trying longest
            now = self.clock()
            tries = ((n.left - (now - at), n) for n, at in self._trouble.values())
            left, notice = max(tries, key=lambda pair: pair[0])
            return self._trouble_text(notice, left)
        if self._late is not None:
            return self._late_text(self._late)
        if self._waiting is not None:
            return self._wait_text(self._waiting, with_time=True)
        return None

    def _draw(self) -> None:
        text = self._line()
        if text is None:
            return
        width = shutil.get_terminal_size().columns - 1
        line = f"respool: {text}"
        if len(line) > width > 1:
            line = line[: width - 1] + "…"
        self.out.write(CLEAR + line)
        self.out.flush()
        self._drawn = True

    def _erase(self) -> None:
        if self._drawn:
            self.out.write(CLEAR)
            self._drawn = False

    def _print(self, text: str) -> None:
        self._erase()
        self.out.write(f"respool: {text}\n")
        self.out.flush()
