"""Python client for pipeline steps (SPEC §10).

```python
from app.client import Respool, ResourceSettings
rp = Respool(url, token)
with rp.allocate("orchestrator:prod-stack",
                 settings=ResourceSettings(gpu_count=3, cpu_count=1, memory="2GB"),
                 timeout=3600) as grant:      # blocks until allocated
    ...                                       # heartbeats run in the background
    if grant.preempted: ...
```

There is one implementation: :class:`AsyncRespool`. The sync :class:`Respool` runs it on a
private event loop in a daemon thread (so a sync caller's heartbeats and ``on_preempted`` run on
that thread).

* ``allocate`` creates the request with a fresh idempotency key, long-polls until it is no longer
  queued, yields a :class:`Grant`, heartbeats in the background (``?attempt=``), and releases on
  exit (``?attempt=``), also when the body raises.
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
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar
from uuid import UUID

import httpx
import msgspec

__all__ = [
    "AllocationTimeout",
    "ApiError",
    "AsyncRespool",
    "Grant",
    "Preempted",
    "Rejected",
    "ResourceSettings",
    "Respool",
    "RespoolError",
]

log = logging.getLogger("respool.client")

T = TypeVar("T")

TRANSIENT_STATUS = frozenset({502, 503, 504})
# Statuses after which the holder no longer (safely) holds its units.
LOST = frozenset({"preempting", "preempted", "expired", "cancelled", "released", "rejected"})
DEFAULT_HEARTBEAT = 30.0
POLL_WAIT = 20.0  # per long-poll; the server caps it anyway (RESPOOL_MAX_WAIT, default 25 s)


# --- errors ----------------------------------------------------------------------------------


class RespoolError(Exception):
    """Base of every error this client raises."""


class ApiError(RespoolError):
    """The server answered with an error (``{status_code, detail, field}``)."""

    def __init__(self, status_code: int, detail: str, field: str | None = None) -> None:
        super().__init__(f"{status_code}: {detail}" + (f" (field {field})" if field else ""))
        self.status_code = status_code
        self.detail = detail
        self.field = field


class _Ended(RespoolError):
    """The request ended without an allocation to use; ``reason`` is the engine's code."""

    verb = "ended"

    def __init__(self, reason: str | None, message: str = "", request_id: UUID | None = None):
        super().__init__(f"{self.verb}: {reason}" + (f": {message}" if message else ""))
        self.reason = reason
        self.message = message
        self.request_id = request_id


class Rejected(_Ended):
    """The request was rejected (or cancelled) instead of allocated."""

    verb = "rejected"


class Preempted(_Ended):
    """The allocation was taken away (preempted, expired) before it could be used."""

    verb = "preempted"


class AllocationTimeout(RespoolError, TimeoutError):
    """Not allocated within ``timeout`` seconds; the request was cancelled."""

    def __init__(self, request_id: UUID, waited: float, message: str = "") -> None:
        super().__init__(
            f"request {request_id} not allocated after {waited:.1f} s"
            + (f": {message}" if message else "")
        )
        self.request_id = request_id
        self.waited = waited
        self.message = message


# --- wire types ------------------------------------------------------------------------------


class ResourceSettings(msgspec.Struct, kw_only=True):
    """SPEC §1 settings; the server turns them into resources. ``cpu_count`` is sent as a JSON
    number with its decimal text preserved (``"0.25"`` and ``Decimal("0.25")`` → ``0.25``; a
    float is sent as its shortest repr)."""

    gpu_count: int | None = None
    cpu_count: Decimal | float | str | None = None
    memory: str | None = None
    pool_resources: dict[str, int] | None = None

    def __post_init__(self) -> None:
        if self.cpu_count is not None:
            self.cpu_count = _as_decimal(self.cpu_count)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def _as_decimal(value: Decimal | float | str) -> Decimal:
    if isinstance(value, bool):
        raise TypeError("cpu_count: expected a number")
    if isinstance(value, Decimal):
        d = value
    elif isinstance(value, int | float):
        d = Decimal(repr(value))
    else:
        try:
            d = Decimal(value.strip())
        except InvalidOperation:
            raise ValueError(f"cpu_count: not a number: {value!r}") from None
    if not d.is_finite():
        raise ValueError(f"cpu_count: not a finite number: {value!r}")
    return d


class RequestState(msgspec.Struct, kw_only=True):
    """The fields of a request this client uses (the server sends more; they are ignored)."""

    id: UUID
    subject: str
    pool: str | None
    resources: dict[str, int]
    status: str
    reason: str | None
    message: str
    attempt: int
    lease_seconds: int | None
    version: int


class _ErrorBody(msgspec.Struct):
    status_code: int = 0
    detail: str = ""
    field: str | None = None


_encoder = msgspec.json.Encoder(decimal_format="number")


class Grant:
    """An allocation held inside ``allocate``.

    ``sent_at`` (``time.monotonic()``) is when the call that saw the allocation was sent: the
    server's lease cannot end before ``sent_at + lease_seconds``, so the grant can tell by
    itself when its lease may have lapsed (no heartbeat got through in time, e.g. the process
    was paused or cut off), without waiting for the server to say so.
    """

    def __init__(self, state: RequestState, sent_at: float | None = None) -> None:
        self.request_id: UUID = state.id
        self.subject = state.subject
        self.resources: dict[str, int] = dict(state.resources)
        self.pool: str | None = state.pool
        self.attempt: int = state.attempt
        self.lease_seconds: int | None = state.lease_seconds
        self.status: str = state.status
        self.reason: str | None = state.reason
        self.message: str = state.message
        self._preempted = threading.Event()
        self._valid_until: float | None = None
        if sent_at is not None:
            self._renewed(sent_at)

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
        """True once a heartbeat showed the request preempting, preempted, expired or gone, or
        once the lease lapsed (:attr:`lease_lapsed`): stop using the units."""
        return self._preempted.is_set() or self.lease_lapsed

    def raise_if_preempted(self) -> None:
        if self.preempted:
            raise Preempted(self.reason, self.message, self.request_id)

    def __repr__(self) -> str:
        return (
            f"Grant(request_id={self.request_id}, pool={self.pool!r}, resources={self.resources}, "
            f"attempt={self.attempt}, preempted={self.preempted})"
        )


OnPreempted = Callable[[Grant], object]


# --- the client ------------------------------------------------------------------------------


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

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        http_timeout: float | None = None,
    ) -> Any:
        """One API call; retries transient failures; raises ApiError for an error answer."""
        content = None if body is None else _encoder.encode(body)
        headers = {"Content-Type": "application/json"} if content is not None else None
        give_up = time.monotonic() + self.retry_for
        tries = 0
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
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code not in TRANSIENT_STATUS:
                    return _parse(resp)
                problem = f"HTTP {resp.status_code}"
                if time.monotonic() >= give_up:
                    return _parse(resp)  # raises ApiError
            if time.monotonic() >= give_up:
                raise RespoolError(f"{method} {path}: giving up after {tries + 1} tries: {problem}")
            delay = min(self._backoff(tries), max(0.0, give_up - time.monotonic()))
            log.info("%s %s: %s; retrying in %.2f s", method, path, problem, delay)
            tries += 1
            await asyncio.sleep(delay)

    async def _request(self, method: str, path: str, **kw: Any) -> RequestState:
        return msgspec.convert(await self._send(method, path, **kw), RequestState)

    # --- plain calls ---

    async def create_request(
        self,
        subject: str,
        *,
        pool: str | None = None,
        resources: Mapping[str, int] | None = None,
        settings: ResourceSettings | None = None,
        preemptible: bool = True,
        max_retries: int = 0,
        lease_seconds: int | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
    ) -> RequestState:
        body: dict[str, Any] = {
            "subject": subject,
            "preemptible": preemptible,
            "max_retries": max_retries,
            "idempotency_key": idempotency_key or str(uuid.uuid4()),
        }
        if pool is not None:
            body["pool"] = pool
        if resources is not None:
            body["resources"] = dict(resources)
        if settings is not None:
            body["settings"] = settings.to_json()
        if lease_seconds is not None:  # absent: the server's default lease
            body["lease_seconds"] = lease_seconds
        if labels is not None:
            body["labels"] = dict(labels)
        return await self._request(
            "POST",
            "/v1/requests",
            params={"wait": wait},
            body=body,
            http_timeout=_poll_timeout(wait),
        )

    async def get_request(
        self, request_id: UUID | str, *, wait: float | None = None, version: int | None = None
    ) -> RequestState:
        return await self._request(
            "GET",
            f"/v1/requests/{request_id}",
            params={"wait": wait, "version": version},
            http_timeout=_poll_timeout(wait),
        )

    async def heartbeat(self, request_id: UUID | str, attempt: int | None = None) -> RequestState:
        return await self._act(request_id, "heartbeat", attempt)

    async def release(self, request_id: UUID | str, attempt: int | None = None) -> RequestState:
        return await self._act(request_id, "release", attempt)

    async def cancel(self, request_id: UUID | str, attempt: int | None = None) -> RequestState:
        return await self._act(request_id, "cancel", attempt)

    async def _act(self, request_id: UUID | str, action: str, attempt: int | None) -> RequestState:
        return await self._request(
            "POST", f"/v1/requests/{request_id}/{action}", params={"attempt": attempt}
        )

    # --- allocate ---

    @contextlib.asynccontextmanager
    async def allocate(
        self,
        subject: str,
        *,
        pool: str | None = None,
        resources: Mapping[str, int] | None = None,
        settings: ResourceSettings | None = None,
        preemptible: bool = True,
        max_retries: int = 0,
        lease_seconds: int | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the allocation deadline (SPEC §10)
        heartbeat_interval: float | None = None,
        on_preempted: OnPreempted | None = None,
    ) -> AsyncIterator[Grant]:
        """Wait for an allocation, hold it (heartbeats) for the block, release it on exit."""
        grant = await self._acquire(
            subject,
            pool=pool,
            resources=resources,
            settings=settings,
            preemptible=preemptible,
            max_retries=max_retries,
            lease_seconds=lease_seconds,
            labels=labels,
            within=timeout,
        )
        beat = self._start_heartbeat(grant, heartbeat_interval, on_preempted)
        try:
            yield grant
        except BaseException:
            await self._finish(grant, beat, quiet=True)
            raise
        await self._finish(grant, beat, quiet=False)

    async def _acquire(self, subject: str, *, within: float | None, **create: Any) -> Grant:
        """Create (fresh idempotency key) and long-poll until no longer queued."""
        started = time.monotonic()
        deadline = None if within is None else started + within

        def next_wait() -> float:
            if deadline is None:
                return POLL_WAIT
            return max(0.0, min(POLL_WAIT, deadline - time.monotonic()))

        sent = time.monotonic()
        state = await self.create_request(
            subject, idempotency_key=str(uuid.uuid4()), wait=next_wait(), **create
        )
        try:
            while state.status == "queued":
                wait = next_wait()
                if deadline is not None and wait <= 0:
                    await self._cancel_quietly(state)
                    raise AllocationTimeout(state.id, time.monotonic() - started, state.message)
                sent = time.monotonic()
                state = await self.get_request(state.id, wait=wait, version=state.version)
        except BaseException as exc:
            if not isinstance(exc, RespoolError):  # e.g. cancelled, KeyboardInterrupt
                await asyncio.shield(self._cancel_quietly(state))
            raise
        if state.status in ("allocated", "preempting"):
            grant = Grant(state, sent_at=sent)
            if state.status == "preempting":
                grant._preempted.set()
            return grant
        if state.status in ("rejected", "cancelled"):
            raise Rejected(state.reason or state.status, state.message, state.id)
        raise Preempted(state.reason or state.status, state.message, state.id)

    async def _cancel_quietly(self, state: RequestState) -> None:
        try:
            await self.cancel(state.id)
        except RespoolError as exc:
            log.warning("could not cancel request %s: %s", state.id, exc)

    def _start_heartbeat(
        self, grant: Grant, interval: float | None, on_preempted: OnPreempted | None
    ) -> asyncio.Task[None]:
        if interval is None:
            interval = grant.lease_seconds / 3 if grant.lease_seconds else DEFAULT_HEARTBEAT
        return asyncio.create_task(self._heartbeat_loop(grant, interval, on_preempted))

    async def _heartbeat_loop(
        self, grant: Grant, interval: float, on_preempted: OnPreempted | None
    ) -> None:
        fired = False

        async def lost(state: RequestState | None) -> None:
            nonlocal fired
            if state is not None:
                grant.status, grant.reason = state.status, state.reason
                grant.message = state.message
            grant._preempted.set()
            if not fired and on_preempted is not None:
                fired = True
                try:
                    result = on_preempted(grant)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("on_preempted callback failed")

        if grant.preempted:
            await lost(None)
        while True:
            await asyncio.sleep(interval)
            sent = time.monotonic()
            try:
                state = await self.heartbeat(grant.request_id, grant.attempt)
            except ApiError as exc:
                if exc.status_code in (404, 409):  # deleted / requeued under a new attempt
                    grant.reason = "requeued" if exc.status_code == 409 else "not_found"
                    grant.message = exc.detail
                    await lost(None)
                    return
                log.warning("heartbeat for %s failed: %s", grant.request_id, exc)
                continue
            except RespoolError as exc:
                log.warning("heartbeat for %s failed: %s", grant.request_id, exc)
                continue
            if state.status in LOST:
                await lost(state)
                if state.status != "preempting":
                    return
            elif state.status == "allocated" and state.attempt == grant.attempt:
                grant._renewed(sent)

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


def _parse(resp: httpx.Response) -> Any:
    if resp.is_success:
        return msgspec.json.decode(resp.content) if resp.content else None
    try:
        err = msgspec.json.decode(resp.content, type=_ErrorBody)
    except (msgspec.DecodeError, msgspec.ValidationError):
        err = _ErrorBody(resp.status_code, resp.text[:200] or resp.reason_phrase)
    raise ApiError(resp.status_code, err.detail, err.field)


def _poll_timeout(wait: float | None) -> float | None:
    return None if not wait else wait + 15.0


# --- sync twin -------------------------------------------------------------------------------


class _LoopThread:
    """A private event loop in a daemon thread; runs coroutines for the sync client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="respool-client", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Respool:
    """Sync client: :class:`AsyncRespool` on a private event loop thread.

    ``on_preempted`` callbacks run on that thread; keep them short."""

    def __init__(self, url: str, token: str | None = None, **options: Any) -> None:
        self._async = AsyncRespool(url, token, **options)
        self._loop: _LoopThread | None = _LoopThread()

    def __enter__(self) -> Respool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run(self._async.aclose())
            self._loop.close()
            self._loop = None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RespoolError("client is closed")
        return self._loop.run(coro)

    def create_request(self, subject: str, **kw: Any) -> RequestState:
        return self._run(self._async.create_request(subject, **kw))

    def get_request(
        self, request_id: UUID | str, *, wait: float | None = None, version: int | None = None
    ) -> RequestState:
        return self._run(self._async.get_request(request_id, wait=wait, version=version))

    def heartbeat(self, request_id: UUID | str, attempt: int | None = None) -> RequestState:
        return self._run(self._async.heartbeat(request_id, attempt))

    def release(self, request_id: UUID | str, attempt: int | None = None) -> RequestState:
        return self._run(self._async.release(request_id, attempt))

    def cancel(self, request_id: UUID | str, attempt: int | None = None) -> RequestState:
        return self._run(self._async.cancel(request_id, attempt))

    @contextlib.contextmanager
    def allocate(
        self,
        subject: str,
        *,
        pool: str | None = None,
        resources: Mapping[str, int] | None = None,
        settings: ResourceSettings | None = None,
        preemptible: bool = True,
        max_retries: int = 0,
        lease_seconds: int | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,
        heartbeat_interval: float | None = None,
        on_preempted: OnPreempted | None = None,
    ) -> Iterator[Grant]:
        """Same as :meth:`AsyncRespool.allocate`, blocking."""
        core = self._async
        grant = self._run(
            core._acquire(
                subject,
                pool=pool,
                resources=resources,
                settings=settings,
                preemptible=preemptible,
                max_retries=max_retries,
                lease_seconds=lease_seconds,
                labels=labels,
                within=timeout,
            )
        )

        async def start() -> asyncio.Task[None]:
            return core._start_heartbeat(grant, heartbeat_interval, on_preempted)

        beat = self._run(start())
        try:
            yield grant
        except BaseException:
            self._run(core._finish(grant, beat, quiet=True))
            raise
        self._run(core._finish(grant, beat, quiet=False))
