"""The engine's answer types (pools, policies, requests, events) shared by the query modules.

The calls themselves live in one module per concern (:mod:`app.db.pools`,
:mod:`app.db.policies`, :mod:`app.db.requests`, ...; see :mod:`app.db`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import asyncpg
import msgspec
from respool_client.wire import TERMINAL as TERMINAL
from respool_client.wire import Created as Created
from respool_client.wire import Event as Event
from respool_client.wire import Policy as Policy
from respool_client.wire import Pool as Pool
from respool_client.wire import Request as Request
from respool_client.wire import Status as Status

Executor = asyncpg.Connection | asyncpg.Pool

T = TypeVar("T")


def _as(kind: type[T], doc: Any) -> T:
    return msgspec.convert(doc, kind, strict=False)
