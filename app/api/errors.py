"""One error shape for every failure: ``{"status_code": int, "detail": str, "field": str|null}``.

Engine errors keep their status and field; validation errors become 400 naming the field;
a database that is down, restarting or unreachable becomes 503 with ``Retry-After``; a full line
of calls waiting for a database connection becomes 429 with ``Retry-After``; anything
unexpected becomes a generic 500 (the traceback goes to the server log only).
"""

from __future__ import annotations

import json
import logging
import re
from decimal import Decimal
from typing import Any

import asyncpg
import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap
from litestar.utils.scope.state import ScopeState
from respool_client.wire import INT64_MAX, ErrorBody

from app.db.connect import PoolSaturated, is_dead_connection
from app.db.errors import EngineError

__all__ = [
    "ApiError",
    "ErrorBody",
    "error_responses",
    "exception_handlers",
    "extreme_number_error",
    "validation_error",
]

log = logging.getLogger("respool.api")


class ApiError(Exception):
    """An error raised by the API layer itself (outside the engine)."""

    def __init__(self, status_code: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
        self.field = field


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"unknown field `(?P<name>[^`]+)`")
_MISSING = re.compile(r"missing required field `(?P<name>[^`]+)`")


def _field_from_message(message: str, path: str | None) -> str | None:
    for pattern in (_UNKNOWN, _MISSING):
        m = pattern.search(message)
        if m:
            name = m.group("name")
            return f"{path}.{name}" if path else name
    return path or None


def _clean_path(path: str | None) -> str | None:
    """A decoder's path in the documented form (``windows[0].days[1]``): an index stays in
    brackets; ``[...]``, a value of a map whose key the decoder does not say, names the map."""
    if not path:
        return None
    return path.replace("[...]", "") or None


# One step of a msgspec error path: ".name", "[0]" or "[...]" (a value of a map).
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def _named_path(path: str, raw: bytes, kind: type[Any], error: str) -> str | None:
    """``path`` (``.devices[...][1]``) with each map value named by its key
    (``devices.gpu[1]``), found in the body ``raw``: the key is the first entry of the map such
    that the body cut after it fails to decode into ``kind`` with the very same ``error``
    (the decoder goes through the body in order and stops at the first error). None when a key
    cannot be found (the caller names the map)."""
    steps = [(m.group(1), m.group(2)) for m in _STEP.finditer(path)]
    if "".join(m.group(0) for m in _STEP.finditer(path)) != path:
        return None
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    out = ""
    node = doc
    for name, index in steps:
        if name is not None and isinstance(node, dict) and name in node:
            out += f".{name}" if out else name
            node = node[name]
        elif index is not None and index != "..." and isinstance(node, list):
            out += f"[{index}]"
            node = node[int(index)]
        elif index == "..." and isinstance(node, dict):
            key = _failing_key(doc, node, kind, error)
            if key is None:
                return None
            out += f".{key}" if out else key
            node = node[key]
        else:
            return None
    return out or None


# Beyond this many entries a map is named as a whole (no field has that many keys; the search
# would only cost the server time).
_MOST_KEYS_SEARCHED = 1024


def _failing_key(doc: Any, node: dict[str, Any], kind: type[Any], error: str) -> str | None:
    """The key of ``node`` (a map inside ``doc``) whose value the decoder refused with
    ``error``. "The body with ``node`` cut after its first n entries fails with ``error``" is
    false up to the culprit and true from it on: a bisection, O(log n) decodes."""
    entries = list(node.items())

    def fails_with_error(n: int) -> bool:
        node.clear()
        node.update(entries[:n])
        try:
            msgspec.json.decode(msgspec.json.encode(doc), type=kind, strict=True)
        except msgspec.ValidationError as exc:
            return str(exc) == error
        return False

    try:
        low, high = 0, len(entries)  # fails_with_error(high) is the body as sent
        if not entries or len(entries) > _MOST_KEYS_SEARCHED or not fails_with_error(high):
            return None
        while high - low > 1:
            mid = (low + high) // 2
            if fails_with_error(mid):
                high = mid
            else:
                low = mid
        return str(entries[high - 1][0])
    finally:
        node.clear()
        node.update(entries)


# --- numbers no field can take ----------------------------------------------------------------
# The largest magnitude any numeric field takes (an int64 column); the most digits a number may
# carry (PostgreSQL's numeric, and Python's int parsing, refuse far fewer than JSON allows).
_LARGEST = Decimal(INT64_MAX)
_MOST_DIGITS = 1000
# A body can only hold such a number if it has a run of 19 digits or a 3-digit exponent:
# a cheap test that spares ordinary bodies a second parse.
_MAYBE_EXTREME = re.compile(rb"[0-9]{19}|[eE][+-]?[0-9]{3}")


def _extreme(value: Decimal) -> str | None:
    """Why ``value`` is a number no field can take, or None."""
    if not value.is_finite() or abs(value) > _LARGEST:
        return "is too large a number"
    if len(value.as_tuple().digits) > _MOST_DIGITS or value.adjusted() < -_MOST_DIGITS:
        return f"has more than {_MOST_DIGITS} digits"
    return None


def _first_extreme(doc: Any, path: str) -> tuple[str, str] | None:
    if isinstance(doc, Decimal):
        why = _extreme(doc)
        return (path, why) if why else None
    if isinstance(doc, dict):
        for key, value in doc.items():
            found = _first_extreme(value, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found = _first_extreme(value, f"{path}[{i}]")
            if found:
                return found
    return None


def extreme_number_error(raw: bytes) -> ApiError | None:
    """A 400 naming the first field of the JSON body ``raw`` that holds a number no field can
    take (beyond ±(2^63-1), or more than 1000 digits): ``members[2].resources.gpu``. None when
    there is none, or when ``raw`` is not JSON (the decoder's own error says so)."""
    if not _MAYBE_EXTREME.search(raw):
        return None
    try:
        doc = json.loads(raw, parse_float=Decimal, parse_int=Decimal)
    except ValueError:
        return None
    found = _first_extreme(doc, "")
    if found is None:
        return None
    field, why = found
    name = field or "the body"
    return ApiError(400, f"{name} {why}", field or None)


def validation_error(
    exc: msgspec.ValidationError | msgspec.DecodeError,
    raw: bytes | None = None,
    kind: type[Any] | None = None,
) -> ApiError:
    """A msgspec error as a 400 naming the offending field as docs/api.md writes fields
    (``windows[0].days[1]``, ``members[2].resources.gpu``, ``devices.gpu[0]``). With the body
    ``raw`` and the type ``kind`` it was decoded into, a value of a map is named by its key;
    without, by the map (``capacity``)."""
    text = str(exc)
    path: str | None = None
    m = _AT.search(text)
    if m:
        text = text[: m.start()]
        at = m.group("path")
        if "[...]" in at and raw is not None and kind is not None:
            path = _named_path(at, raw, kind, str(exc))
        if path is None:
            path = _clean_path(at.lstrip("."))
    if not isinstance(exc, msgspec.ValidationError):  # ValidationError is a DecodeError
        return ApiError(400, f"invalid JSON body: {text}", None)
    field = _field_from_message(text, path)
    detail = f"{field}: {text}" if field and field not in text else text
    return ApiError(400, detail, field)


def _respond(
    status_code: int,
    detail: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response[ErrorBody]:
    return Response(ErrorBody(status_code, detail, field), status_code=status_code, headers=headers)


def _engine_error(_: Request[Any, Any, Any], exc: EngineError) -> Response[ErrorBody]:
    if exc.status_code >= 500:
        log.error("engine guard refused a change: %s (field=%s)", exc.message, exc.field)
    return _respond(exc.status_code, exc.message, exc.field)


def _api_error(_: Request[Any, Any, Any], exc: ApiError) -> Response[ErrorBody]:
    return _respond(exc.status_code, exc.detail, exc.field, getattr(exc, "headers", None))


def _validation(_: Request[Any, Any, Any], exc: ValidationException) -> Response[ErrorBody]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    first = extra[0] if extra and isinstance(extra[0], dict) else {}
    message = str(first.get("message") or exc.detail)
    key = first.get("key")
    field = _field_from_message(message, None)
    if field is None and isinstance(key, str) and key != "data":
        field = _clean_path(key)
    detail = f"{field}: {message}" if field and field not in message else message
    return _respond(400, detail, field)


def _http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorBody]:
    if isinstance(exc.__cause__, SerializationException):
        # Litestar could not even parse the body (1e400, an integer of thousands of digits):
        # name the field from the body it read (cached in the connection's state).
        raw = ScopeState.from_scope(request.scope).body
        if isinstance(raw, bytes) and (extreme := extreme_number_error(raw)) is not None:
            return _respond(400, extreme.detail, extreme.field)
    # Keep the exception's headers: a 405 must carry ``Allow`` (RFC 9110).
    return _respond(exc.status_code, exc.detail, headers=dict(exc.headers or {}) or None)


# Seconds a client should wait before retrying a 503 (the database is down or restarting).
RETRY_AFTER = 1

# The database cannot serve us right now, whatever the request: refused or lost connections
# (OSError, also TimeoutError from a bounded acquire or statement, app.db.connect), a closed
# connection (08xxx, InterfaceError), a server shutting down, crashed, in recovery or a backend
# terminated by an operator (57P01-57P05), no free connection slots (53300); and asyncpg's
# error for a pooled connection the server had closed (app.db.connect.is_dead_connection).
_DATABASE_DOWN: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.exceptions.DatabaseDroppedError,
    asyncpg.exceptions.IdleSessionTimeoutError,
    asyncpg.TooManyConnectionsError,
    # HA: no host of a multi-host DSN is the primary yet, or a write reached a standby.
    asyncpg.exceptions.TargetServerAttributeNotMatched,
    asyncpg.ReadOnlySQLTransactionError,
    # A deadlock or serialization failure that went on after the data layer's retries
    # (app.db.errors.engine_errors): nothing was kept; the same call may well succeed.
    asyncpg.TransactionRollbackError,
)


def _database_down(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    """503 with ``Retry-After``: a transient outage, never a 500 (docs/api.md, "Errors")."""
    log.warning(
        "%s %s: database unavailable: %s: %s",
        request.method,
        request.url.path,
        type(exc).__name__,
        exc,
    )
    return _respond(
        503, "database unavailable, retry later", headers={"Retry-After": str(RETRY_AFTER)}
    )


# Seconds a client should wait before retrying a 429 (too many calls waiting for a connection).
BUSY_RETRY_AFTER = 1


def _saturated(request: Request[Any, Any, Any], exc: PoolSaturated) -> Response[ErrorBody]:
    """429 with ``Retry-After``: the line of calls waiting for a database connection is full;
    this call was refused before it did anything (docs/api.md, "Backpressure")."""
    log.warning("%s %s: refused, %s", request.method, request.url.path, exc)
    return _respond(
        429,
        f"too busy: {exc.limit} calls are already waiting for a database connection"
        f" (RESPOOL_MAX_PENDING={exc.limit}); nothing was changed, retry after"
        f" {BUSY_RETRY_AFTER} s",
        headers={"Retry-After": str(BUSY_RETRY_AFTER)},
    )


def _integrity(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    """A constraint the engine did not check first: still the client's input, never a 500."""
    name = getattr(exc, "constraint_name", None) or "a database constraint"
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    if isinstance(exc, asyncpg.UniqueViolationError):
        return _respond(409, f"conflicts with an existing row ({name})")
    return _respond(400, f"invalid input: violates {name}")


def _bad_data(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    """A value PostgreSQL cannot take (a NUL character in a string, a number out of range):
    the client's input, never a 500. The API validates first; this is the safety net."""
    log.warning("%s %s: invalid input: %s", request.method, request.url.path, exc)
    message = str(exc).split("\n", 1)[0][:200]
    return _respond(400, f"invalid input: {message}")


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        return _integrity(request, exc)
    if isinstance(exc, asyncpg.DataError):  # SQLSTATE class 22, also raised by asyncpg's encoders
        return _bad_data(request, exc)
    if isinstance(exc, _DATABASE_DOWN) or is_dead_connection(exc):
        return _database_down(request, exc)
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _respond(500, "internal server error")


exception_handlers: ExceptionHandlersMap = {
    EngineError: _engine_error,
    ApiError: _api_error,
    ValidationException: _validation,
    HTTPException: _http,
    PoolSaturated: _saturated,
    Exception: _unexpected,
}


# --- OpenAPI ---------------------------------------------------------------------------------

_ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed input; `field` names the offending field",
    401: "No valid bearer token",
    403: "The token's role may not do this",
    404: "Not found (for a client token, also another subject's request)",
    409: "Conflicts with the current state",
    422: "The idempotency key was used with a different body",
    429: "Too many calls are waiting for a database connection (RESPOOL_MAX_PENDING); nothing"
    " was changed, retry after Retry-After seconds",
    503: "The database is unavailable; retry later",
}


def error_responses(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI declarations of a ``/v1`` route's error answers (all with :class:`ErrorBody`):
    ``codes`` plus 401 and 403 (auth), 429 (too many calls waiting for a database connection)
    and 503 (database down), which any route may answer."""
    return {
        code: ResponseSpec(
            data_container=ErrorBody, description=_ERROR_DESCRIPTIONS[code], generate_examples=False
        )
        for code in sorted({*codes, 401, 403, 429, 503})
    }
