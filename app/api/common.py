"""Shared plumbing of the controllers: state access and strict body decoding."""

from __future__ import annotations

from typing import Any, TypeAlias, TypeVar

import asyncpg
import msgspec
from litestar import Request, delete
from litestar.datastructures import State
from litestar.params import JSONBody, SkipValidation
from msgspec import UNSET

from app.api.coalesce import CreateCoalescer, ReleaseCoalescer
from app.api.errors import error_responses, validation_error
from app.api.numbers import refuse_extreme_numbers, refuse_string_decimals
from app.notify import Notifier
from app.settings import Settings

__all__ = [
    "AnyRequest",
    "StrictBody",
    "coalescer",
    "db",
    "decode_body",
    "delete_by_ref",
    "notifier",
    "releases",
    "sent",
    "settings",
]

T = TypeVar("T")

AnyRequest: TypeAlias = Request[Any, Any, Any]
# A JSON body that OpenAPI documents but Litestar does not decode: decode_body does, strictly.
StrictBody: TypeAlias = SkipValidation[JSONBody[T]]


def db(state: State) -> asyncpg.Pool:
    pool: asyncpg.Pool = state.db
    return pool


def coalescer(state: State) -> CreateCoalescer:
    """The app's create coalescer (app.api.coalesce) for its current pool, made on first use."""
    pool = db(state)
    made: CreateCoalescer | None = getattr(state, "coalescer", None)
    if made is None or made.pool is not pool:
        made = state.coalescer = CreateCoalescer(
            pool, default_lease_seconds=settings(state).default_lease_seconds
        )
    return made


def releases(state: State) -> ReleaseCoalescer:
    """The app's release coalescer (app.api.coalesce) for its current pool, made on first use."""
    pool = db(state)
    made: ReleaseCoalescer | None = getattr(state, "release_coalescer", None)
    if made is None or made.pool is not pool:
        made = state.release_coalescer = ReleaseCoalescer(pool)
    return made


def notifier(state: State) -> Notifier:
    n: Notifier = state.notifier
    return n


def settings(state: State) -> Settings:
    s: Settings = state.settings
    return s


async def decode_body(request: Request[Any, Any, Any], kind: type[T]) -> T:
    """Decode the raw JSON body strictly into ``kind``.

    Litestar has already validated the body leniently (it converts via Python objects, where
    ``"8"`` may pass as an int and ``cpu_count`` goes through a binary float). Decoding the raw
    bytes again with ``strict=True`` refuses strings and floats for integers, and keeps a
    ``Decimal`` exactly as written in the JSON text.
    """
    raw = await request.body()
    refuse_extreme_numbers(raw)  # 1e400, 10^30, 5000 digits: 400 naming the field
    try:
        body = msgspec.json.decode(raw or b"{}", type=kind, strict=True)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise validation_error(exc, raw or b"{}", kind) from None
    refuse_string_decimals(raw, kind)  # msgspec takes "1" for a Decimal even when strict
    return body


def sent(body: msgspec.Struct) -> dict[str, Any]:
    """The fields of a PATCH body that were sent (absent ones are UNSET and stay as they are)."""
    return {k: v for k, v in msgspec.structs.asdict(body).items() if v is not UNSET}


def delete_by_ref(kind: str) -> delete:
    """``DELETE /{ref}`` of a pool or a policy: 204; 409 while it has live requests, unless the
    ``force`` query parameter cancels them."""
    return delete(
        "/{ref:str}",
        status_code=204,
        summary=f"Delete a {kind} (force cancels its requests)",
        responses=error_responses(400, 404, 409),
    )
