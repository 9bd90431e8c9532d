"""Holding an allocation: create, wait for the grant (keeping a queue lease), then heartbeat and
watch the request while it is held, and release at the end.

* :func:`acquire` creates the request with a fresh idempotency key and :func:`await_grant`
  long-polls it until it is no longer queued. While it waits it heartbeats the queued request
  with ``?queue_lease_seconds=<queue lease>`` every third of that lease, so a waiter that died
  (SIGKILL, OOM, a lost machine) gives its queue place up within about the queue lease (the
  server cancels it with reason ``abandoned``).
* :func:`start_holding` heartbeats the granted attempt (``?attempt=``) on a fixed schedule and
  long-polls the request, so ``preempting``/``preempted``/``expired``/``cancelled`` reach the
  grant at once, whatever the heartbeat interval.
* :func:`finish` stops both and releases (``?attempt=``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from respool_client._verbs import RequestVerbs
from respool_client.errors import AllocationTimeout, ApiError, Preempted, Rejected, RespoolError
from respool_client.grant import Grant, OnPreempted
from respool_client.wire import HOLDING, Request

__all__ = [
    "QUEUE_LEASE",
    "OnChange",
    "acquire",
    "await_grant",
    "finish",
    "heartbeat_interval",
    "start_holding",
]

log = logging.getLogger("respool.client")

# Statuses after which the holder no longer (safely) holds its units.
LOST = frozenset({"preempting", "preempted", "expired", "cancelled", "released", "rejected"})
DEFAULT_HEARTBEAT = 30.0  # no lease: heartbeats only report the status (the watch does too)
MAX_HEARTBEAT = 30.0
POLL_WAIT = 20.0  # per long-poll; the server caps it anyway (RESPOOL_MAX_WAIT, default 25 s)
QUEUE_LEASE = 30  # seconds a waiter that stopped heartbeating keeps its queue place

# Called with every new state of a request (``respool run`` acts on them).
OnChange = Callable[[Request], Awaitable[None] | None]
# What a holder uses now, sent with a heartbeat (``{"gpu_memory_mb": N}``; None: nothing).
Usage = Callable[[], Awaitable[dict[str, int] | None]]


async def _call(callback: OnChange | None, state: Request) -> None:
    if callback is not None:
        result = callback(state)
        if inspect.isawaitable(result):
            await result


async def acquire(
    rp: RequestVerbs,
    subject: str,
    *,
    within: float | None,
    queue_lease: int | None,
    on_wait: OnChange | None = None,
    kind: type[Grant] = Grant,
    **fields: Any,
) -> Grant:
    """Create the request (fresh idempotency key) and wait until it is no longer queued;
    its grant, of type ``kind`` (a :class:`~respool_client.grant.Reservation` for ``reserve``)."""
    started = sent = time.monotonic()
    deadline = None if within is None else started + within
    # No ``wait`` on the create: the queue lease must be set as soon as the request exists.
    state = await rp.create_request(subject, **fields)
    return await await_grant(rp, state, sent, started, deadline, queue_lease, on_wait, kind)


class _QueueLease:
    """Heartbeats a queued request with ``?queue_lease_seconds=seconds`` every third of that,
    for as long as its client waits. A heartbeat that reaches the request just after its grant
    renews the allocation with the request's own lease: the queue lease length never applies
    to an allocation."""

    def __init__(self, rp: RequestVerbs, state: Request, seconds: int) -> None:
        self.rp, self.request_id, self.attempt = rp, state.id, state.attempt
        self.seconds = seconds

    async def keep(self) -> None:
        every = self.seconds / 3
        while True:
            try:
                state = await self.rp.heartbeat(
                    self.request_id, self.attempt, within=every, queue_lease_seconds=self.seconds
                )
            except ApiError as exc:
                if exc.status_code in (404, 409):  # gone, or moved on to another attempt
                    return
                log.warning("queue heartbeat for %s failed: %s", self.request_id, exc)
            except RespoolError as exc:
                log.warning("queue heartbeat for %s failed: %s", self.request_id, exc)
            else:
                if state.status != "queued":
                    return
            await asyncio.sleep(every)


async def await_grant(
    rp: RequestVerbs,
    state: Request,
    sent: float,
    started: float,
    deadline: float | None,
    queue_lease: int | None,
    on_wait: OnChange | None = None,
    kind: type[Grant] = Grant,
) -> Grant:
    """Long-poll a request until it is no longer queued, heartbeating it with a queue lease of
    ``queue_lease`` seconds meanwhile (None: none); its grant, or the exception that says why
    not (a timeout cancels the request, and so does a cancelled caller)."""
    keeper = None if queue_lease is None else _QueueLease(rp, state, queue_lease)
    beats = None
    if keeper is not None and state.status == "queued":
        beats = asyncio.create_task(keeper.keep())
    try:
        while state.status == "queued":
            await _call(on_wait, state)
            wait = _next_wait(deadline)
            if deadline is not None and wait <= 0:
                await _cancel_quietly(rp, state.id)
                raise AllocationTimeout(state.id, time.monotonic() - started, state.message)
            sent = time.monotonic()
            state = await rp.get_request(state.id, wait=wait, version=state.version)
    except BaseException as exc:
        if not isinstance(exc, RespoolError):  # e.g. cancelled, KeyboardInterrupt
            await asyncio.shield(_cancel_quietly(rp, state.id))
        raise
    finally:
        if beats is not None:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
    if state.status in HOLDING:
        grant = kind(state, sent_at=sent)
        if state.status == "preempting":
            grant._preempted.set()
        return grant
    if state.status in ("rejected", "cancelled"):
        raise Rejected(state.reason or state.status, state.message, state.id)
    raise Preempted(state.reason or state.status, state.message, state.id)


async def _cancel_quietly(rp: RequestVerbs, request_id: UUID) -> None:
    try:
        await rp.cancel(request_id)
    except RespoolError as exc:
        log.warning("could not cancel request %s: %s", request_id, exc)


def start_holding(
    rp: RequestVerbs,
    grant: Grant,
    interval: float | None,
    on_preempted: OnPreempted | None,
    on_change: OnChange | None = None,
    usage: Usage | None = None,
) -> asyncio.Task[None]:
    """Heartbeat ``grant`` and long-poll its request, in a background task; ``usage``: what
    to report with each heartbeat (``{"gpu_memory_mb": N}``; None: nothing this time)."""
    every = heartbeat_interval(grant.lease_seconds) if interval is None else interval
    notice = _Notice(grant, on_preempted)
    return asyncio.create_task(_hold(rp, grant, every, notice, on_change, usage))


async def _hold(
    rp: RequestVerbs,
    grant: Grant,
    interval: float,
    notice: _Notice,
    on_change: OnChange | None,
    usage: Usage | None = None,
) -> None:
    if grant.preempted:
        await notice.fire()
    tasks = [
        asyncio.create_task(_heartbeat_loop(rp, grant, interval, notice, usage)),
        asyncio.create_task(_watch_loop(rp, grant, notice, on_change)),
    ]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _heartbeat_loop(
    rp: RequestVerbs, grant: Grant, interval: float, notice: _Notice, usage: Usage | None = None
) -> None:
    """Renew the lease every ``interval`` s on a fixed schedule: each heartbeat gives up
    (retries included) before the next is due, so a slow answer never delays the next. With
    ``usage``, each heartbeat carries what it measured just before (docs/placement.md)."""
    due = time.monotonic()
    while True:
        due += interval
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        used = await _measured(usage)
        sent = time.monotonic()
        try:
            state = await rp.heartbeat(grant.request_id, grant.attempt, within=interval, usage=used)
        except ApiError as exc:
            if exc.status_code in (404, 409):  # deleted / requeued under a new attempt
                grant.reason = "requeued" if exc.status_code == 409 else "not_found"
                grant.message = exc.detail
                await notice.fire()
                return
            log.warning("heartbeat for %s failed: %s", grant.request_id, exc)
            continue
        except RespoolError as exc:
            log.warning("heartbeat for %s failed: %s", grant.request_id, exc)
            continue
        if state.attempt != grant.attempt or state.status in LOST:
            grant._update(state)
            await notice.fire()
            if state.status != "preempting" or state.attempt != grant.attempt:
                return
        elif state.status == "allocated":
            grant._renewed(sent)
        due = max(due, time.monotonic() - interval)  # a stall (SIGSTOP) does not burst


async def _measured(usage: Usage | None) -> dict[str, int] | None:
    """What ``usage`` measured now; a measurement that fails sends nothing (logged)."""
    if usage is None:
        return None
    try:
        return await usage()
    except Exception as exc:  # noqa: BLE001 - a measurement never stops the heartbeats
        log.warning("could not measure the use of the slice: %s", exc)
        return None


async def _watch_loop(
    rp: RequestVerbs, grant: Grant, notice: _Notice, on_change: OnChange | None
) -> None:
    """Long-poll the request while it is held: a change (``preempting``, ``preempted``,
    ``expired``, ``cancelled``, a requeue) reaches the grant as soon as the server sees it,
    whatever the heartbeat interval. Ends once the grant's attempt no longer holds."""
    version = grant.version
    failures = 0
    while True:
        try:
            state = await rp.get_request(grant.request_id, wait=POLL_WAIT, version=version)
        except ApiError as exc:
            if exc.status_code == 404:
                grant.reason, grant.message = "not_found", exc.detail
                await notice.fire()
                return
            failures += 1
            log.warning("watching %s failed: %s", grant.request_id, exc)
            await asyncio.sleep(rp._backoff(failures))
            continue
        except RespoolError as exc:
            failures += 1
            log.warning("watching %s failed: %s", grant.request_id, exc)
            await asyncio.sleep(rp._backoff(failures))
            continue
        failures = 0
        if state.version == version:
            continue
        version = state.version
        moved_on = state.attempt != grant.attempt
        if moved_on or state.status in LOST:
            grant._update(state)
            await notice.fire()
        await _call(on_change, state)
        if moved_on or state.status not in HOLDING:
            return


async def finish(
    rp: RequestVerbs,
    grant: Grant,
    beat: asyncio.Task[None],
    *,
    quiet: bool,
    used: dict[str, int] | None = None,
) -> None:
    """Stop holding ``grant`` and release it (``quiet``: log a failed release, don't raise);
    ``used`` settles its rate keys (docs/rates.md). A refused settlement still releases the
    grant, without it, and then raises (unless ``quiet``)."""
    beat.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await beat
    try:
        try:
            await rp.release(grant.request_id, grant.attempt, used=used)
        except ApiError as exc:
            if exc.status_code == 404:
                return
            if used is not None and (exc.field or "").startswith("used"):
                await rp.release(grant.request_id, grant.attempt)  # never leave it held
                raise
            if exc.status_code != 409:
                raise
            # Requeued under a new attempt meanwhile: we are done with it, drop it too.
            await rp.release(grant.request_id, used=used)
    except RespoolError as exc:
        if not quiet:
            raise
        log.warning("could not release request %s: %s", grant.request_id, exc)


def _next_wait(deadline: float | None) -> float:
    if deadline is None:
        return POLL_WAIT
    return max(0.0, min(POLL_WAIT, deadline - time.monotonic()))


def heartbeat_interval(lease_seconds: int | None) -> float:
    """The default heartbeat interval: a third of the lease, at most ``MAX_HEARTBEAT`` s, so at
    least three heartbeats (each bounded by the interval) fall within any lease window."""
    if not lease_seconds:
        return DEFAULT_HEARTBEAT
    return min(lease_seconds / 3, MAX_HEARTBEAT)


class _Notice:
    """Marks a grant lost and calls ``on_preempted`` once (sync or async callback)."""

    def __init__(self, grant: Grant, callback: OnPreempted | None) -> None:
        self.grant = grant
        self.callback = callback
        self.fired = False

    async def fire(self) -> None:
        self.grant._preempted.set()
        if self.fired or self.callback is None:
            return
        self.fired = True
        try:
            result = self.callback(self.grant)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_preempted callback failed")
