"""The respool calls the store makes, through ``respool_client``, in one small module.

Every answer is the request as a plain dict (the JSON shape of respool's API). Errors become the
exceptions ZenML's server maps to HTTP answers: 404 → :class:`KeyError` (ZenML: 404; the step
heartbeat treats a vanished request as cancelled), other 4xx → :class:`ValueError` (ZenML: 400),
respool unreachable, timing out or answering 5xx → :class:`RespoolUnavailable` (ZenML: 500 with
that message).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from uuid import UUID

import msgspec
from respool_client import ApiError, Respool, RespoolError

T = TypeVar("T")

# Transient failures (connection errors, 502/503/504) are retried by the client for this long
# before the store gives up: a ZenML API call should not hang for the client's default minute.
RETRY_FOR = 8.0


class RespoolUnavailable(RuntimeError):
    """respool could not be reached or could not answer; the message says where and why."""


class RespoolApi:
    """The few calls the store needs, on one thread-safe sync :class:`respool_client.Respool`."""

    def __init__(self, url: str | None = None, token: str | None = None, **options: Any) -> None:
        self.url = (url or os.environ.get("RESPOOL_URL") or "http://127.0.0.1:8080").rstrip("/")
        token = token if token is not None else os.environ.get("RESPOOL_TOKEN")
        options = {"retry_for": RETRY_FOR, "request_timeout": 10.0, **options}
        self._rp = Respool(self.url, token or None, **options)

    def close(self) -> None:
        self._rp.close()

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except ApiError as exc:
            if exc.status_code == 404:
                raise KeyError(f"respool: {exc.detail}") from exc
            if exc.status_code >= 500:
                raise RespoolUnavailable(
                    f"respool at {self.url} answered {exc.status_code} to {what}: {exc.detail}"
                ) from exc
            raise ValueError(f"respool refused {what}: {exc.detail}") from exc
        except RespoolError as exc:
            raise RespoolUnavailable(
                f"respool at {self.url} is unreachable ({exc}); resource requests cannot be"
                " created, renewed or released until it is back"
            ) from exc

    def _call(self, what: str, fn: Callable[[], Any]) -> dict[str, Any]:
        with self._errors(what):
            doc: dict[str, Any] = msgspec.to_builtins(fn())
            return doc

    def create_request(self, subject: str, **body: Any) -> dict[str, Any]:
        return self._call("create", lambda: self._rp.create_request(subject, **body))

    def get_request(self, request_id: UUID | str) -> dict[str, Any]:
        return self._call("get", lambda: self._rp.get_request(request_id))

    def heartbeat(self, request_id: UUID | str, lease_seconds: int | None = None) -> dict[str, Any]:
        return self._call(
            "heartbeat", lambda: self._rp.heartbeat(request_id, lease_seconds=lease_seconds)
        )

    def release(self, request_id: UUID | str) -> dict[str, Any]:
        return self._call("release", lambda: self._rp.release(request_id))

    def list_policies(self) -> list[dict[str, Any]]:
        """Every policy the token may read (``GET /v1/policies``)."""
        with self._errors("list policies"):
            return list(msgspec.to_builtins(self._rp.call("GET", "/v1/policies")))

    def list_requests(self, **filters: Any) -> tuple[list[dict[str, Any]], str | None]:
        """One page, newest first: ``(items, next_cursor)``."""
        page = self._call("list", lambda: self._rp.list_requests(**filters))
        return list(page["items"]), page.get("next_cursor")
