"""The async client: :class:`AsyncRespool` (one implementation; the sync client runs it).

* ``allocate`` creates the request with a fresh idempotency key, long-polls until it is no longer
  queued, yields a :class:`~respool_client.grant.Grant`, heartbeats in the background
  (``?attempt=``), and releases on exit (``?attempt=``), also when the body raises.
* Transient failures (connection errors, 502/503/504) are retried with exponential backoff and
  jitter for up to ``retry_for`` seconds; the idempotency key makes a retried create safe, and a
  long-poll that loses its server (a restart) simply polls again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypedDict, Unpack
from uuid import UUID

import httpx
import msgspec
from msgspec import UNSET
from respool_client.errors import AllocationTimeout, ApiError, Preempted, Rejected, RespoolError
from respool_client.grant import Grant, OnPreempted
from respool_client.wire import (
    HOLDING,
    ErrorBody,
    Request,
    RequestBatch,
    RequestBatchCreate,
    RequestCreate,
    RequestPage,
    ResourceSettings,
)

__all__ = ["AsyncRespool", "RequestFields"]

log = logging.getLogger("respool.client")

TRANSIENT_STATUS = frozenset({502, 503, 504})
# Statuses after which the holder no longer (safely) holds its units.
LOST = frozenset({"preempting", "preempted", "expired", "cancelled", "released", "rejected"})
DEFAULT_HEARTBEAT = 30.0  # no lease: heartbeats only report the status (the watch does too)
MAX_HEARTBEAT = 30.0
POLL_WAIT = 20.0  # per long-poll; the server caps it anyway (RESPOOL_MAX_WAIT, default 25 s)

_encoder = msgspec.json.Encoder(decimal_format="number")

# Called with every new state of a held request (``respool run`` acts on them).
OnChange = Callable[[Request], Awaitable[None] | None]


class RequestFields(TypedDict, total=False):
    """What a new request asks for beside its subject (SPEC §3): the keyword arguments that
    ``create_request`` and ``allocate`` of both clients share. Absent: ``pool`` and
    ``resources`` none, ``preemptible`` true, ``max_retries`` 0, ``lease_seconds`` the server's
    default, no ``settings`` or ``labels``."""

    pool: str | None
    resources: Mapping[str, int] | None
    settings: ResourceSettings | None
    preemptible: bool
    max_retries: int
    lease_seconds: int | None
    labels: Mapping[str, str] | None


class AsyncRespool:
    """Async client. Use as ``async with AsyncRespool(url, token) as rp:`` or call ``aclose``."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        retry_for: float = 60.0,
        backoff_base: float = 0.1,
        backoff_max: float = 5.0,
        request_timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry_for = retry_for
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.request_timeout = request_timeout
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._transport = transport
        self._http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> AsyncRespool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self.url,
                headers=self._headers,
                timeout=self.request_timeout,
                transport=self._transport,
            )
        return self._http

    # --- transport with retries ---

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter (at least a tenth of the step)."""
        step = min(self.backoff_max, self.backoff_base * 2.0**attempt)
        jitter: float = random.uniform(0.1, 1.0)  # noqa: S311 - jitter, not crypto
        return step * jitter

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        http_timeout: float | None = None,
        retry_for: float | None = None,
    ) -> Any:
        """Any API call, for what has no method of its own (the ``respool`` CLI): the decoded
        JSON answer (None when empty). Transient failures are retried; raises :class:`ApiError`
        for an error answer, and :class:`RespoolError` (its ``__cause__`` the last transport
        error) when the server did not answer within ``retry_for`` seconds (default: the
        client's; 0: one try); ``http_timeout``: seconds for each try (default: the client's
        ``request_timeout``)."""
        content = None if body is None else _encoder.encode(body)
        headers = {"Content-Type": "application/json"} if content is not None else None
        give_up = time.monotonic() + (self.retry_for if retry_for is None else retry_for)
        tries = 0
        cause: httpx.TransportError | None = None
        while True:
            problem: str
            try:
                resp = await self._client().request(
                    method,
                    path,
                    params={k: v for k, v in (params or {}).items() if v is not None},
                    content=content,
                    headers=headers,
                    timeout=http_timeout if http_timeout is not None else self.request_timeout,
                )
            except httpx.TransportError as exc:
                problem, cause = f"{type(exc).__name__}: {exc}", exc
            else:
                if resp.status_code not in TRANSIENT_STATUS:
                    return _parse(resp)
                problem = f"HTTP {resp.status_code}"
                if time.monotonic() >= give_up:
                    return _parse(resp)  # raises ApiError
            if time.monotonic() >= give_up:
                raise RespoolError(
                    f"{method} {path}: giving up after {tries + 1} tries: {problem}"
                ) from cause
            delay = min(self._backoff(tries), max(0.0, give_up - time.monotonic()))
            log.info("%s %s: %s; retrying in %.2f s", method, path, problem, delay)
            tries += 1
            await asyncio.sleep(delay)

    async def _request(self, method: str, path: str, **kw: Any) -> Request:
        return msgspec.convert(await self.call(method, path, **kw), Request, strict=False)

    # --- plain calls ---

    async def create_request(
        self,
        subject: str,
        *,
        idempotency_key: str | None = None,
        wait: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> Request:
        """Create (or, with the same ``idempotency_key``, replay) a request (SPEC §3)."""
        resources = fields.get("resources")
        labels = fields.get("labels")
        lease_seconds = fields.get("lease_seconds")
        body = RequestCreate(
            subject=subject,
            pool=fields.get("pool"),
            resources=None if resources is None else dict(resources),
            settings=fields.get("settings"),
            preemptible=fields.get("preemptible", True),
            max_retries=fields.get("max_retries", 0),
            # absent: the server's default lease
            lease_seconds=UNSET if lease_seconds is None else lease_seconds,
            idempotency_key=idempotency_key or str(uuid.uuid4()),
            labels=None if labels is None else dict(labels),
        )
        return await self._request(
            "POST",
            "/v1/requests",
            params={"wait": wait},
            body=body,
            http_timeout=_poll_timeout(wait),
        )

    async def create_many(
        self, members: Sequence[RequestCreate], *, all_or_nothing: bool = False
    ) -> list[Request]:
        """Create 1 to 1,000 requests in one transaction (``POST /v1/requests/batch``).

        Each member is an ordinary create body, created as a single create would be (granted
        where it fits, else queued, or rejected), in member order, which is also their queue
        order; the answers come back in that order. A member without an idempotency key gets a
        fresh one, so a retried batch never creates twice. A malformed member refuses the whole
        batch: :class:`ApiError` naming ``members[i].field``, and nothing is created.

        ``all_or_nothing=True`` makes the members a gang (SPEC §11.6): same subject, pool,
        preemptible and max_retries; one ``gang_id``; granted all together in one pool or not at
        all; rejected, preempted, expired and cancelled together.
        """
        fresh = msgspec.structs.replace
        keyed = [
            m if m.idempotency_key else fresh(m, idempotency_key=str(uuid.uuid4())) for m in members
        ]
        answer = await self.call(
            "POST",
            "/v1/requests/batch",
            body=RequestBatchCreate(members=keyed, all_or_nothing=all_or_nothing),
        )
        return msgspec.convert(answer, RequestBatch, strict=False).items

    async def get_request(
        self, request_id: UUID | str, *, wait: float | None = None, version: int | None = None
    ) -> Request:
        return await self._request(
            "GET",
            f"/v1/requests/{request_id}",
            params={"wait": wait, "version": version},
            http_timeout=_poll_timeout(wait),
        )

    async def heartbeat(
        self,
        request_id: UUID | str,
        attempt: int | None = None,
        *,
        within: float | None = None,
        lease_seconds: int | None = None,
    ) -> Request:
        """Extend the lease (queued: set the queue lease) to now + ``lease_seconds`` (default:
        the request's); ``within``: give up (retries included) after this many seconds."""
        return await self._request(
            "POST",
            f"/v1/requests/{request_id}/heartbeat",
            params={"attempt": attempt, "lease_seconds": lease_seconds},
            retry_for=within,
            http_timeout=None if within is None else min(self.request_timeout, max(within, 1.0)),
        )

    async def list_requests(
        self,
        *,
        pool: str | None = None,
        subject: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        gang_id: UUID | str | None = None,
    ) -> RequestPage:
        """One page of requests, newest first (``next_cursor`` pages on); ``gang_id``: the
        members of one gang."""
        params: dict[str, Any] = {"pool": pool, "subject": subject, "status": status}
        params["gang_id"] = None if gang_id is None else str(gang_id)
        params |= {"limit": limit, "cursor": cursor}
        doc = await self.call("GET", "/v1/requests", params=params)
        return msgspec.convert(doc, RequestPage, strict=False)

    async def release(self, request_id: UUID | str, attempt: int | None = None) -> Request:
        return await self._act(request_id, "release", attempt)

    async def cancel(self, request_id: UUID | str, attempt: int | None = None) -> Request:
        return await self._act(request_id, "cancel", attempt)

    async def _act(self, request_id: UUID | str, action: str, attempt: int | None) -> Request:
        return await self._request(
            "POST", f"/v1/requests/{request_id}/{action}", params={"attempt": attempt}
        )

    # --- allocate ---

    @contextlib.asynccontextmanager
    async def allocate(
        self,
        subject: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the allocation deadline (SPEC §10)
        heartbeat_interval: float | None = None,
        on_preempted: OnPreempted | None = None,
        **fields: Unpack[RequestFields],
    ) -> AsyncIterator[Grant]:
        """Wait for an allocation, hold it (heartbeats) for the block, release it on exit."""
        grant = await self._acquire(subject, within=timeout, **fields)
        beat = self._start_holding(grant, heartbeat_interval, on_preempted)
        try:
            yield grant
        except BaseException:
            await self._finish(grant, beat, quiet=True)
            raise
        await self._finish(grant, beat, quiet=False)

    async def _acquire(
        self,
        subject: str,
        *,
        within: float | None,
        on_wait: OnChange | None = None,
        **create: Unpack[RequestFields],
    ) -> Grant:
        """Create (fresh idempotency key) and long-poll until no longer queued."""
        started = time.monotonic()
        deadline = None if within is None else started + within
        sent = time.monotonic()
        state = await self.create_request(
            subject, idempotency_key=str(uuid.uuid4()), wait=_next_wait(deadline), **create
        )
        return await self._await_grant(state, sent, started, deadline, on_wait)

    async def _await_grant(
        self,
        state: Request,
        sent: float,
        started: float,
        deadline: float | None,
        on_wait: OnChange | None = None,
    ) -> Grant:
        """Long-poll a request until it is no longer queued; its grant, or the exception that
        says why not (a timeout cancels the request, and so does a cancelled caller)."""
        try:
            while state.status == "queued":
                if on_wait is not None:
                    result = on_wait(state)
                    if inspect.isawaitable(result):
                        await result
                wait = _next_wait(deadline)
                if deadline is not None and wait <= 0:
                    await self._cancel_quietly(state)
                    raise AllocationTimeout(state.id, time.monotonic() - started, state.message)
                sent = time.monotonic()
                state = await self.get_request(state.id, wait=wait, version=state.version)
        except BaseException as exc:
            if not isinstance(exc, RespoolError):  # e.g. cancelled, KeyboardInterrupt
                await asyncio.shield(self._cancel_quietly(state))
            raise
        if state.status in HOLDING:
            grant = Grant(state, sent_at=sent)
            if state.status == "preempting":
                grant._preempted.set()
            return grant
        if state.status in ("rejected", "cancelled"):
            raise Rejected(state.reason or state.status, state.message, state.id)
        raise Preempted(state.reason or state.status, state.message, state.id)

    async def _cancel_quietly(self, state: Request) -> None:
        try:
            await self.cancel(state.id)
        except RespoolError as exc:
            log.warning("could not cancel request %s: %s", state.id, exc)

    def _start_holding(
        self,
        grant: Grant,
        interval: float | None,
        on_preempted: OnPreempted | None,
        on_change: OnChange | None = None,
    ) -> asyncio.Task[None]:
        """Heartbeat ``grant`` and long-poll its request, in a background task."""
        every = heartbeat_interval(grant.lease_seconds) if interval is None else interval
        notice = _Notice(grant, on_preempted)
        return asyncio.create_task(self._hold(grant, every, notice, on_change))

    async def _hold(
        self, grant: Grant, interval: float, notice: _Notice, on_change: OnChange | None
    ) -> None:
        if grant.preempted:
            await notice.fire()
        tasks = [
            asyncio.create_task(self._heartbeat_loop(grant, interval, notice)),
            asyncio.create_task(self._watch_loop(grant, notice, on_change)),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _heartbeat_loop(self, grant: Grant, interval: float, notice: _Notice) -> None:
        """Renew the lease every ``interval`` s on a fixed schedule: each heartbeat gives up
        (retries included) before the next is due, so a slow answer never delays the next."""
        due = time.monotonic()
        while True:
            due += interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent = time.monotonic()
            try:
                state = await self.heartbeat(grant.request_id, grant.attempt, within=interval)
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

    async def _watch_loop(self, grant: Grant, notice: _Notice, on_change: OnChange | None) -> None:
        """Long-poll the request while it is held: a change (``preempting``, ``preempted``,
        ``expired``, ``cancelled``, a requeue) reaches the grant as soon as the server sees it,
        whatever the heartbeat interval. Ends once the grant's attempt no longer holds."""
        version = grant.version
        failures = 0
        while True:
            try:
                state = await self.get_request(grant.request_id, wait=POLL_WAIT, version=version)
            except ApiError as exc:
                if exc.status_code == 404:
                    grant.reason, grant.message = "not_found", exc.detail
                    await notice.fire()
                    return
                failures += 1
                log.warning("watching %s failed: %s", grant.request_id, exc)
                await asyncio.sleep(self._backoff(failures))
                continue
            except RespoolError as exc:
                failures += 1
                log.warning("watching %s failed: %s", grant.request_id, exc)
                await asyncio.sleep(self._backoff(failures))
                continue
            failures = 0
            if state.version == version:
                continue
            version = state.version
            moved_on = state.attempt != grant.attempt
            if moved_on or state.status in LOST:
                grant._update(state)
                await notice.fire()
            if on_change is not None:
                result = on_change(state)
                if inspect.isawaitable(result):
                    await result
            if moved_on or state.status not in HOLDING:
                return

    async def _finish(self, grant: Grant, beat: asyncio.Task[None], *, quiet: bool) -> None:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
        try:
            try:
                await self.release(grant.request_id, grant.attempt)
            except ApiError as exc:
                if exc.status_code == 404:
                    return
                if exc.status_code != 409:
                    raise
                # Requeued under a new attempt meanwhile: we are done with it, drop it too.
                await self.release(grant.request_id)
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


def _parse(resp: httpx.Response) -> Any:
    if resp.is_success:
        return msgspec.json.decode(resp.content) if resp.content else None
    try:
        err = msgspec.json.decode(resp.content, type=ErrorBody)
    except (msgspec.DecodeError, msgspec.ValidationError):
        err = ErrorBody(resp.status_code, resp.text[:200] or resp.reason_phrase)
    raise ApiError(resp.status_code, err.detail, err.field)


def _poll_timeout(wait: float | None) -> float | None:
    return None if not wait else wait + 15.0
