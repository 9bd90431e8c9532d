"""Logging: text or JSON lines (``RESPOOL_LOG_FORMAT``), and one line per request state change.

``configure_logging(level, fmt)`` sets up the root logger on stderr and routes uvicorn's loggers
through it, so a JSON deployment emits nothing but JSON lines.

**State changes.** Every status change notifies ``respool_request`` (in the transaction that made
it, delivered at commit), except the changes a create makes to the request it creates, which
:func:`log_created` logs from the create's answer; every process's LISTEN connection receives
every notification.
:class:`StateChangeLog` logs a notification only when the backend that sent it is one of this
process's own connections (``app.db.connect.own_backend_pids``), so each change is logged exactly
once in the whole deployment, by the process that made it (an API replica or a reconciler), right
after it committed. Changes made from other sessions (psql) are in ``respool.request_events``
but not in the logs. The line carries ``request_id``, ``subject``, ``pool``, ``from_status``,
``status``, ``reason``, ``attempt`` and ``version``, all from the notification's payload.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

import msgspec
from respool_client.wire import Request

from app.db.connect import own_backend_pids

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "StateChange",
    "StateChangeLog",
    "configure_logging",
    "emit_state_change",
    "log_created",
]

LOG_FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else was passed with ``extra=`` and is logged as a
# field of its own in JSON.
_RECORD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
    | {"message", "asctime", "taskName"}
)

_encoder = msgspec.json.Encoder(enc_hook=str)

state_log = logging.getLogger("respool.state")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, extras, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return _encoder.encode(doc).decode()


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Root logger on stderr in ``fmt`` (text | json) at ``level``; uvicorn's loggers join it.

    Call it before creating the uvicorn server, and give uvicorn ``log_config=None`` so that it
    keeps this setup.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
        lg.setLevel(level)


class StateChange(msgspec.Struct, frozen=True):
    """The ``respool_request`` payload (``_record_event`` in sql/functions/030_status.sql)."""

    id: UUID
    status: str
    version: int
    pool: str | None = None
    subject: str | None = None
    from_status: str | None = msgspec.field(default=None, name="from")
    reason: str | None = None
    attempt: int | None = None


_decode = msgspec.json.Decoder(StateChange).decode


class StateChangeLog:
    """Notification observer (:meth:`app.notify.Notifier.observe`); see the module docstring.

    The engine's payload carries everything the line needs, so logging costs no query.
    ``own_pids`` is for tests.
    """

    def __init__(
        self,
        *,
        own_pids: Callable[[], frozenset[int]] = own_backend_pids,
        logger: logging.Logger = state_log,
    ) -> None:
        self._own_pids = own_pids
        self._log = logger

    def __call__(self, pid: int, payload: str) -> None:
        if pid not in self._own_pids():
            return
        try:
            change = _decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return  # the notifier already warns about malformed payloads
        self.emit(change)

    def emit(self, change: StateChange) -> None:
        """Log ``change`` as one line (its fields are also JSON fields)."""
        emit_state_change(change, self._log)


def log_created(request: Request) -> None:
    """Log the changes a create made to the request it created, from its answer. The engine
    does not notify them (nobody can wait for a request before its create answers): new ->
    queued or rejected, then the grant made in the same call. A gang member's later changes
    (its gang's start) are notified and logged as usual."""
    first = request.status if request.version == 1 else "queued"
    changes: list[tuple[str | None, str, str | None, int]] = [
        (None, first, request.reason if request.version == 1 else None, 1)
    ]
    if request.version > 1 and request.gang_id is None:
        changes.append(("queued", request.status, request.reason, request.version))
    for frm, to, reason, version in changes:
        emit_state_change(
            StateChange(
                id=request.id,
                status=to,
                version=version,
                pool=request.pool,
                subject=request.subject,
                from_status=frm,
                reason=reason,
                attempt=request.attempt,
            )
        )


def emit_state_change(change: StateChange, logger: logging.Logger = state_log) -> None:
    """One state-change line (its fields are also JSON fields)."""
    logger.info(
        "request %s %s -> %s (subject %s, pool %s%s)",
        change.id,
        change.from_status or "new",
        change.status,
        change.subject or "?",
        change.pool or "-",
        f", reason {change.reason}" if change.reason else "",
        extra={
            "event": "state_change",
            "request_id": str(change.id),
            "subject": change.subject,
            "pool": change.pool,
            "from_status": change.from_status,
            "status": change.status,
            "reason": change.reason,
            "attempt": change.attempt,
            "version": change.version,
        },
    )
