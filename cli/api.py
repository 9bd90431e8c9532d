"""The CLI's HTTP layer: the client library (:class:`respool_client.Respool`) with typed
answers, every failure a one-line :class:`CliError`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar, overload
from urllib.parse import quote

import httpx
import msgspec
from respool_client import ApiError, Respool, RespoolError
from respool_client.wire import Policy, Pool

from cli.common import BadValue, CliError, names_parameter, user_message

__all__ = ["Api", "connect_api", "segment"]

T = TypeVar("T")

_ID_REF = re.compile(r"\b(pool|policy) ([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})\b")


def segment(value: str) -> str:
    """One URL path segment (a pool ref, a policy id), escaped."""
    return quote(value, safe="")


class Api:
    """A few typed verbs over one :class:`Respool`; every failure becomes a :class:`CliError`."""

    def __init__(self, client: Respool, url: str) -> None:
        self._client = client
        self.url = url
        # What the user calls the pools and policies this command has seen, by id: errors name
        # them so, never by id.
        self._names: dict[str, str] = {}
        self.last_status: int | None = None  # of the last API error answer

    @overload
    def call(
        self,
        method: str,
        path: str,
        kind: type[T],
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> T: ...

    @overload
    def call(
        self,
        method: str,
        path: str,
        kind: None = None,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None: ...

    def call(
        self,
        method: str,
        path: str,
        kind: type[T] | None = None,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> T | None:
        """``method path`` with a JSON ``body``; the answer decoded as ``kind`` (None: ignored).

        One try: a person at a terminal would rather hear at once that the API is away."""
        self.last_status = None
        try:
            data = self._client.call(
                method, path, params=params, body=body, http_timeout=timeout, retry_for=0
            )
        except ApiError as exc:
            self.last_status = exc.status_code
            # A value the user typed that the API refused as malformed: a usage error (exit 2).
            bad = exc.status_code in (400, 422) and names_parameter(exc.field)
            raise (BadValue if bad else CliError)(self._named(_error_text(exc))) from None
        except RespoolError as exc:
            raise CliError(self._unreachable(exc)) from None
        if kind is None:
            return None
        try:
            result = msgspec.convert(data, kind, strict=False)
        except msgspec.ValidationError as exc:
            raise CliError(f"unexpected answer from {self.url}{path}: {exc}") from None
        self._learn(result)
        return result

    def find(self, path: str, kind: type[T]) -> T | None:
        """``GET path`` decoded as ``kind``, or None when the API answers 404 (a node that is
        not registered yet)."""
        try:
            return self.call("GET", path, kind)
        except CliError:
            if self.last_status == 404:
                return None
            raise

    def _unreachable(self, exc: RespoolError) -> str:
        cause = exc.__cause__
        if isinstance(cause, httpx.TimeoutException):
            return f"the respool API at {self.url} did not answer in time"
        if isinstance(cause, httpx.ConnectError):
            return (
                f"cannot reach the respool API at {self.url} ({_reason(cause)}); is `respool "
                "serve` running? (set --url or RESPOOL_URL)"
            )
        return f"request to {self.url} failed: {_reason(cause or exc)}"

    def _learn(self, result: object) -> None:
        for item in result if isinstance(result, list) else [result]:
            if isinstance(item, Pool):
                self._names[str(item.id)] = f"pool {item.name}"
            elif isinstance(item, Policy):
                self._names[str(item.id)] = f"the policy of {item.subject} on pool {item.pool}"

    def _named(self, text: str) -> str:
        """``text`` with ``pool <id>`` / ``policy <id>`` of known ones replaced by their names."""
        return _ID_REF.sub(lambda m: self._names.get(m.group(2), m.group(0)), text)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _error_text(exc: ApiError) -> str:
    detail = user_message(exc.detail or f"HTTP {exc.status_code}", exc.field)
    if exc.status_code == 401:
        detail += " (pass --token or set RESPOOL_TOKEN)"
    return detail


@contextmanager
def connect_api(url: str, token: str | None, *, timeout: float = 30.0) -> Iterator[Api]:
    """An :class:`Api` for ``url`` (with ``token`` as a Bearer token), closed on exit."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise BadValue(f"--url must start with http:// or https://, got {url!r}")
    with Respool(base, token, request_timeout=timeout, retry_for=0) as client:
        yield Api(client, base)
