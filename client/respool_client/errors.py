"""The exceptions of the client: every one is a :class:`RespoolError`."""

from __future__ import annotations

from uuid import UUID

__all__ = ["AllocationTimeout", "ApiError", "Preempted", "Rejected", "RespoolError"]


class RespoolError(Exception):
    """Base of every error this client raises."""


class ApiError(RespoolError):
    """The server answered with an error (``{status_code, detail, field}``)."""

    def __init__(self, status_code: int, detail: str, field: str | None = None) -> None:
        super().__init__(f"{status_code}: {detail}" + (f" (field {field})" if field else ""))
        self.status_code = status_code
        self.detail = detail
        self.field = field


def field_led(detail: str, field: str, label: str, rest: str) -> str | None:
    """``detail`` when it starts with ``field`` (or the field's head, before a dot), that word
    replaced by ``label`` (the option the user typed) and ``rest`` (the part of the field below
    it): ``capacity.gpu must be ...`` → ``--capacity: gpu must be ...``. None when it does not,
    or when the word names a kind of thing (``pool 'x' not found``: kept as it is)."""
    head = field.partition(".")[0]
    for prefix, named in ((field, rest), (head, "")):
        if detail.startswith((f"{prefix} ", f"{prefix}:")) and not detail.startswith(f"{prefix} '"):
            tail = detail[len(prefix) :].lstrip(": ")
            return f"{label}: {named} {tail}" if named else f"{label}: {tail}"
    return None


class _Ended(RespoolError):
    """The request ended without an allocation to use; ``reason`` is the engine's code."""

    verb = "ended"

    def __init__(
        self, reason: str | None, message: str = "", request_id: UUID | None = None
    ) -> None:
        super().__init__(f"{self.verb}: {reason}" + (f": {message}" if message else ""))
        self.reason, self.message, self.request_id = reason, message, request_id


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
