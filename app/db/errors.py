"""The one place that turns the engine's private SQLSTATEs into Python errors."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import asyncpg

__all__ = [
    "BadInput",
    "Conflict",
    "EngineError",
    "IdempotencyMismatch",
    "InvariantBroken",
    "NotFound",
    "TRANSIENT",
    "engine_errors",
    "error_for",
    "translate",
]

T = TypeVar("T")
P = ParamSpec("P")


class EngineError(Exception):
    """An expected failure reported by the SQL engine; ``status_code`` is the HTTP answer."""

    status_code = 400

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field or None


class BadInput(EngineError):
    status_code = 400


class NotFound(EngineError):
    status_code = 404


class Conflict(EngineError):
    status_code = 409


class IdempotencyMismatch(EngineError):
    status_code = 422


class InvariantBroken(EngineError):
    """A guard refused a change that would break an invariant: a bug, never user error."""

    status_code = 500


_BY_SQLSTATE: dict[str, type[EngineError]] = {
    "RP400": BadInput,
    "RP404": NotFound,
    "RP409": Conflict,
    "RP422": IdempotencyMismatch,
    "RP500": InvariantBroken,
    "RP501": InvariantBroken,  # a grant found no node to place it on (docs/placement.md)
}


def translate(exc: asyncpg.PostgresError) -> EngineError | None:
    """The EngineError for an RPxxx SQLSTATE, or None for any other database error."""
    if (exc.sqlstate or "") not in _BY_SQLSTATE:
        return None
    message = str(exc.args[0]) if exc.args else str(exc)
    return error_for(exc.sqlstate or "", message, getattr(exc, "column_name", None))


def error_for(sqlstate: str, message: str, field: str | None) -> EngineError:
    """The EngineError an RPxxx SQLSTATE stands for (one member's error of a batched call)."""
    return _BY_SQLSTATE.get(sqlstate, InvariantBroken)(message, field)


# A transaction the database rolled back to break a conflict (deadlock, serialization failure,
# SQLSTATE class 40): nothing of it was kept, so running it again is safe, and usually succeeds.
TRANSIENT: tuple[type[asyncpg.PostgresError], ...] = (asyncpg.TransactionRollbackError,)
# How many times a data-layer call runs when the database rolls it back that way; after the
# last, the error goes up (the API answers 503 with Retry-After, app.api.errors).
ATTEMPTS = 3


def _retriable(db: object) -> bool:
    """Whether a call on ``db`` ran in a transaction of its own (so it can run again): a pool
    hands it a fresh connection; a connection outside a caller's transaction autocommits."""
    if isinstance(db, asyncpg.Pool):
        return True
    return isinstance(db, asyncpg.Connection) and not db.is_in_transaction()


def engine_errors(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Decorate a data-layer call: engine errors (RP4xx, RP500) become :class:`EngineError`s;
    a transaction the database rolled back to break a deadlock or a serialization conflict
    runs again, up to :data:`ATTEMPTS` times in all, when it was the call's own transaction."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        attempt = 1
        while True:
            try:
                return await fn(*args, **kwargs)
            except TRANSIENT:
                if attempt >= ATTEMPTS or not args or not _retriable(args[0]):
                    raise
                attempt += 1
            except asyncpg.PostgresError as exc:
                mapped = translate(exc)
                if mapped is None:
                    raise
                raise mapped from exc

    return wrapper
