"""The CLI's HTTP client: typed calls to the respool API, failures as one-line CliErrors."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar, overload
from urllib.parse import quote

import httpx
import msgspec

from cli.common import CliError

__all__ = ["Api", "connect_api", "segment"]

T = TypeVar("T")

_encoder = msgspec.json.Encoder(decimal_format="number")


class _ErrorBody(msgspec.Struct):
    status_code: int = 0
    detail: str = ""
    field: str | None = None


def segment(value: str) -> str:
    """One URL path segment (a pool ref, a policy id), escaped."""
    return quote(value, safe="")


class Api:
    """A few typed verbs over one ``httpx.Client``; every failure becomes a :class:`CliError`."""

    def __init__(self, client: httpx.Client, url: str) -> None:
        self._client = client
        self.url = url

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
        """``method path`` with a JSON ``body``; the answer decoded as ``kind`` (None: ignored)."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        content = None if body is None else _encoder.encode(body)
        headers = {"content-type": "application/json"} if content is not None else {}
        try:
            response = self._client.request(
                method,
                path,
                content=content,
                params=query,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.ConnectError as exc:
            raise CliError(
                f"cannot reach the respool API at {self.url} ({_reason(exc)}); is `respool serve` "
                "running? (set --url or RESPOOL_URL)"
            ) from None
        except httpx.TimeoutException:
            raise CliError(f"the respool API at {self.url} did not answer in time") from None
        except httpx.HTTPError as exc:
            raise CliError(f"request to {self.url} failed: {_reason(exc)}") from None
        if response.status_code >= 400:
            raise CliError(_error_text(response))
        if kind is None:
            return None
        try:
            return msgspec.json.decode(response.content, type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CliError(f"unexpected answer from {self.url}{path}: {exc}") from None


def _reason(exc: httpx.HTTPError) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _error_text(response: httpx.Response) -> str:
    try:
        body = msgspec.json.decode(response.content, type=_ErrorBody)
        detail = body.detail or response.reason_phrase
    except (msgspec.DecodeError, msgspec.ValidationError):
        detail = f"HTTP {response.status_code} {response.reason_phrase}"
    if response.status_code == 401:
        detail += " (pass --token or set RESPOOL_TOKEN)"
    return detail


@contextmanager
def connect_api(url: str, token: str | None, *, timeout: float = 30.0) -> Iterator[Api]:
    """An :class:`Api` for ``url`` (with ``token`` as a Bearer token), closed on exit."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise CliError(f"--url must start with http:// or https://, got {url!r}")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=base, headers=headers, timeout=timeout) as client:
        yield Api(client, base)
