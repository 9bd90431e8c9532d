"""The HTTP transport of the client: one ``httpx.AsyncClient``, retries with backoff, and error
answers turned into :class:`~respool_client.errors.ApiError`.

Transient failures (connection errors, 502/503/504, and 429: the server's line of calls waiting
for a database connection is full) are retried with exponential backoff and jitter, never sooner
than the answer's ``Retry-After``, for up to ``retry_for`` seconds (and never past
``retry_until``, when set; an answer asking to wait past that is final); a create
carries an idempotency key, so retrying it is safe, and a long-poll that loses its server (a
restart) simply polls again. A :class:`RetryListener` hears of every failed try, in words
(``cannot reach http://127.0.0.1:9 (connection refused)``), and of the first answer after them:
``respool run`` tells its user at once instead of staying silent until it gives up.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import logging
import math
import os
import random
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import msgspec
from respool_client.errors import ApiError, RespoolError
from respool_client.wire import ErrorBody

__all__ = ["RetryListener", "Retrying", "Transport", "poll_timeout", "retry_after"]

log = logging.getLogger("respool.client")

# 429: nothing was done (the server's line of calls waiting for a database connection is full).
TRANSIENT_STATUS = frozenset({429, 502, 503, 504})

_encoder = msgspec.json.Encoder(decimal_format="number")


@dataclass(frozen=True)
class Retrying:
    """A try of ``method path`` failed and will be retried: ``problem`` in words
    (``cannot reach http://127.0.0.1:9 (connection refused)``, ``http://… answered HTTP 503``),
    ``tries`` failed so far, and ``left`` seconds until the call gives up."""

    method: str
    path: str
    problem: str
    tries: int
    left: float


class RetryListener(Protocol):
    """Hears how the calls of a :class:`Transport` fare (it must not raise)."""

    def retrying(self, notice: Retrying) -> None:
        """A try failed; the call tries again (``notice.left`` seconds at most)."""

    def answered(self) -> None:
        """A call got an answer after failed tries."""


class Transport:
    """The connection to one respool API: base URL, bearer token and retry settings."""

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
        # Monotonic time past which no call retries (None: ``retry_for`` alone decides).
        self.retry_until: float | None = None
        self.listener: RetryListener | None = None

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
        if self.retry_until is not None:
            give_up = min(give_up, self.retry_until)
        tries = 0
        cause: httpx.TransportError | None = None
        while True:
            problem: str
            at_least = 0.0  # the server's Retry-After, in seconds
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
                said = self._trouble(exc)
            else:
                if resp.status_code not in TRANSIENT_STATUS:
                    if tries and self.listener is not None:
                        self.listener.answered()
                    return _parse(resp)
                problem = f"HTTP {resp.status_code}"
                said = f"{self.url} answered HTTP {resp.status_code}"
                at_least = retry_after(resp)
                if time.monotonic() + at_least >= give_up:
                    return _parse(resp)  # raises ApiError: no try is left before giving up
            if time.monotonic() >= give_up:
                raise RespoolError(
                    f"{method} {path}: giving up after {tries + 1} tries: {problem}"
                ) from cause
            left = give_up - time.monotonic()
            delay = min(max(self._backoff(tries), at_least), max(0.0, left))
            log.info("%s %s: %s; retrying in %.2f s", method, path, problem, delay)
            tries += 1
            if self.listener is not None:
                self.listener.retrying(Retrying(method, path, said, tries, left))
            await asyncio.sleep(delay)

    def _trouble(self, exc: httpx.TransportError) -> str:
        """``exc`` in a user's words: what failed, and why as the OS says it."""
        why = _reason(exc)
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return f"cannot reach {self.url} ({why})"
        if isinstance(exc, httpx.TimeoutException):
            return f"no answer from {self.url} ({why})"
        return f"lost the connection to {self.url} ({why})"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _reason(exc: httpx.TransportError) -> str:
    """Why a try failed, in the OS's words when it gave them (``connection refused``)."""
    for cause in _causes(exc):
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve the host name: {cause.strerror or cause}".lower()
        if isinstance(cause, OSError) and cause.errno:
            return os.strerror(cause.errno).lower()
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return str(exc) or type(exc).__name__


# The longest Retry-After honoured (a larger one is taken as this), so a wrong header cannot park
# a client for hours; retry_for bounds the whole call anyway.
MAX_RETRY_AFTER = 60.0


def retry_after(resp: httpx.Response) -> float:
    """The seconds an answer's ``Retry-After`` asks to wait (delay-seconds or an HTTP date;
    0 when absent or unreadable), at most :data:`MAX_RETRY_AFTER`."""
    raw = resp.headers.get("retry-after", "").strip()
    if not raw:
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return 0.0
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        seconds = (when - datetime.datetime.now(datetime.UTC)).total_seconds()
    if not math.isfinite(seconds):
        return 0.0
    return min(max(0.0, seconds), MAX_RETRY_AFTER)


def _parse(resp: httpx.Response) -> Any:
    if resp.is_success:
        return msgspec.json.decode(resp.content) if resp.content else None
    try:
        err = msgspec.json.decode(resp.content, type=ErrorBody)
    except (msgspec.DecodeError, msgspec.ValidationError):
        err = ErrorBody(resp.status_code, resp.text[:200] or resp.reason_phrase)
    raise ApiError(resp.status_code, err.detail, err.field)


def poll_timeout(wait: float | None) -> float | None:
    """The HTTP timeout of a long-poll of ``wait`` seconds (the server answers by then)."""
    return None if not wait else wait + 15.0
