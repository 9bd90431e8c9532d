"""The allocation a step holds inside ``allocate``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

from respool_client.errors import Preempted
from respool_client.wire import Request

__all__ = ["Grant", "OnPreempted"]


class Grant:
    """An allocation held inside ``allocate``.

    ``sent_at`` (``time.monotonic()``) is when the call that saw the allocation was sent: the
    server's lease cannot end before ``sent_at + lease_seconds``, so the grant can tell by
    itself when its lease may have lapsed (no heartbeat got through in time, e.g. the process
    was paused or cut off), without waiting for the server to say so.
    """

    def __init__(self, state: Request, sent_at: float | None = None) -> None:
        self.request_id: UUID = state.id
        self.subject = state.subject
        self.resources: dict[str, int] = dict(state.resources)
        self.pool: str | None = state.pool
        self.attempt: int = state.attempt
        self.lease_seconds: int | None = state.lease_seconds
        self.status: str = state.status
        self.reason: str | None = state.reason
        self.message: str = state.message
        # When the units will be taken by force (``preempting``): stop before then.
        self.deadline: datetime | None = state.preempt_deadline
        self.version: int = state.version
        self._preempted = threading.Event()
        self._valid_until: float | None = None
        if sent_at is not None:
            self._renewed(sent_at)

    def _update(self, state: Request) -> None:
        """Take the status, reason, message and deadline of a newer answer about the request."""
        self.status, self.reason, self.message = state.status, state.reason, state.message
        self.version = max(self.version, state.version)
        if state.preempt_deadline is not None:
            self.deadline = state.preempt_deadline

    def _renewed(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (monotonic) extended the lease; once lapsed, a
        grant stays lapsed (the step was told to stop)."""
        if self.lease_seconds and not self.lease_lapsed:
            self._valid_until = sent_at + self.lease_seconds

    @property
    def lease_lapsed(self) -> bool:
        """True when no heartbeat extended the lease within ``lease_seconds``: the server may
        have expired it and granted the units to someone else."""
        return self._valid_until is not None and time.monotonic() >= self._valid_until

    @property
    def preempted(self) -> bool:
        """True once the request was seen preempting, preempted, expired, cancelled or gone,
        or once the lease lapsed (:attr:`lease_lapsed`): stop using the units."""
        return self._preempted.is_set() or self.lease_lapsed

    def wait_preempted(self, timeout: float | None = None) -> bool:
        """Block until :attr:`preempted` turns true (True) or ``timeout`` passes (False)."""
        return self._preempted.wait(timeout) or self.lease_lapsed

    def raise_if_preempted(self) -> None:
        if self.preempted:
            raise Preempted(self.reason, self.message, self.request_id)

    def __repr__(self) -> str:
        return (
            f"Grant(request_id={self.request_id}, pool={self.pool!r}, resources={self.resources}, "
            f"attempt={self.attempt}, preempted={self.preempted})"
        )


OnPreempted = Callable[[Grant], object]
