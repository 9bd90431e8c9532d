"""A wire ``Request`` as the server answers it, for client tests that need no server."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
from respool_client import Request

__all__ = ["wire_request"]


def wire_request(**fields: Any) -> Request:
    """An allocated request of pool ``a100s`` (subject, resources, attempt and every other field
    as given in ``fields``)."""
    now = datetime.now(UTC).isoformat()
    doc: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "subject": "orchestrator:prod",
        "pool": "a100s",
        "pool_id": str(uuid.uuid4()),
        "policy_id": None,
        "resources": {"gpu": 2, "step_run": 1},
        "preemptible": True,
        "priority": 0,
        "status": "allocated",
        "reason": None,
        "message": "",
        "queue_position": None,
        "attempt": 1,
        "max_retries": 0,
        "lease_seconds": None,
        "lease_expires_at": None,
        "preempt_deadline": None,
        "idempotency_key": None,
        "labels": {},
        "version": 1,
        "created_at": now,
        "updated_at": now,
        "allocated_at": now,
        "finished_at": None,
        **fields,
    }
    return msgspec.convert(doc, Request, strict=False)
