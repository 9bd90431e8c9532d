"""Request bodies and answers of the HTTP API.

They are defined once, in the client distribution (:mod:`respool_client.wire`): the server
decodes bodies and encodes answers with the very types the client and the CLI use. Their
constraints are msgspec ``Meta``; the OpenAPI-only ones sit in ``Meta.extra_json_schema``,
which Litestar copies into the OpenAPI document (see that module's docstring).
"""

from __future__ import annotations

from respool_client.wire import INT32_MAX as INT32_MAX
from respool_client.wire import INT64_MAX as INT64_MAX
from respool_client.wire import PolicyCreate as PolicyCreate
from respool_client.wire import PolicyUpdate as PolicyUpdate
from respool_client.wire import PoolCreate as PoolCreate
from respool_client.wire import PoolUpdate as PoolUpdate
from respool_client.wire import Readiness as Readiness
from respool_client.wire import RequestCreate as RequestCreate
from respool_client.wire import RequestPage as RequestPage
from respool_client.wire import ResourceSettings as ResourceSettings

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "PolicyCreate",
    "PolicyUpdate",
    "PoolCreate",
    "PoolUpdate",
    "Readiness",
    "RequestCreate",
    "RequestPage",
    "ResourceSettings",
]
