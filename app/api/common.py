"""Shared plumbing of the controllers: state access and strict body decoding."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Annotated, Any, TypeAlias, TypeVar

import asyncpg
import msgspec
from litestar import Request, delete
from litestar.datastructures import State
from litestar.dto import AbstractDTO
from litestar.exceptions import SerializationException
from litestar.params import JSONBody, QueryParameter, SkipValidation
from msgspec import UNSET

from app.api.coalesce import CreateCoalescer, ReleaseCoalescer
from app.api.errors import error_responses, validation_error
from app.api.numbers import refuse_extreme_numbers, refuse_string_decimals
from app.notify import Notifier
from app.settings import Settings

__all__ = [
    "AnyRequest",
    "DecodedOnce",
    "StrictBody",
    "Wait",
    "capped_wait",
    "coalescer",
    "db",
    "decode_body",
    "decode_strict",
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
# A long-poll's ``wait`` query parameter; capped_wait reads it.
Wait = Annotated[
    float | None,
    QueryParameter(
        ge=0,
        description="Seconds to wait (capped by RESPOOL_MAX_WAIT)",
        schema_extra={"minimum": 0},  # Litestar drops a bound of 0 from the document
    ),
]


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


def capped_wait(state: State, wait: float | None) -> float:
    """A long-poll's seconds to wait: ``wait`` capped by RESPOOL_MAX_WAIT (0: answer now)."""
    return min(float(wait), settings(state).max_wait) if wait else 0.0


async def decode_body(request: Request[Any, Any, Any], kind: type[T]) -> T:
    """Decode the raw JSON body strictly into ``kind`` (:func:`decode_strict`).

    Litestar has already parsed the body (a ``StrictBody`` without :class:`DecodedOnce`), into
    Python objects only: it does not validate it. Decoding the raw bytes with ``strict=True``
    refuses strings and floats for integers, and keeps a ``Decimal`` exactly as written in the
    JSON text.
    """
    return decode_strict(await request.body(), kind)


def decode_strict(
    raw: bytes,
    kind: type[T],
    not_json: Callable[[msgspec.DecodeError], Exception] = validation_error,
) -> T:
    """The JSON body ``raw`` decoded strictly into ``kind``, or a 400 naming the field
    (``not_json(error)`` is raised when ``raw`` is not JSON at all)."""
    refuse_extreme_numbers(raw)  # 1e400, 10^30, 5000 digits: 400 naming the field
    try:
        body = msgspec.json.decode(raw or b"{}", type=kind, strict=True)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, raw or b"{}", kind) from None
    except msgspec.DecodeError as exc:
        raise not_json(exc) from None
    refuse_string_decimals(raw, kind)  # msgspec takes "1" for a Decimal even when strict
    return body


class DecodedOnce(AbstractDTO[T]):
    """``dto=DecodedOnce[Kind]`` on a route whose ``data`` is a ``StrictBody[Kind]``: the handler
    gets the body decoded by :func:`decode_strict` alone, from the raw bytes, where Litestar would
    first parse it into Python objects that nothing reads. The OpenAPI document describes
    ``data`` exactly as without it. (Set ``return_dto=None`` on the route: answers are
    encoded as usual.)"""

    @classmethod
    def create_for_field_definition(cls, *args: Any, **kwargs: Any) -> None:
        """Nothing to prepare: no transfer model, the body decodes straight into ``Kind``."""

    @classmethod
    def create_openapi_schema(
        cls, field_definition: Any, handler_id: str, schema_creator: Any
    ) -> Any:
        return schema_creator.for_field_definition(field_definition)

    @classmethod
    def is_supported_model_type_field(cls, field_definition: Any) -> bool:
        return False  # never an answer's DTO

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Generator[Any, None, None]:
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: Any) -> bool:
        return False

    def decode_bytes(self, value: bytes) -> T:
        # Not JSON: the 400 Litestar answers when it parses a body itself.
        return decode_strict(value, self.model_type, not_json=_litestar_not_json)


def _litestar_not_json(exc: msgspec.DecodeError) -> Exception:
    return SerializationException(str(exc))


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
