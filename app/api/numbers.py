"""Numbers are numbers, within range (docs/api.md, "Numbers and bounds").

msgspec decodes a ``Decimal`` from a JSON number *or* a JSON string, even with ``strict=True``,
so ``settings.cpu_count: "1"`` would pass. :func:`refuse_string_decimals` finds every
``Decimal`` field of a body's Struct tree and refuses a string there (400 naming the field).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import msgspec
from msgspec import inspect

from app.api.errors import ApiError, extreme_number_error

__all__ = ["decimal_paths", "refuse_extreme_numbers", "refuse_string_decimals"]


def refuse_extreme_numbers(raw: bytes) -> None:
    """400 naming the field when the body ``raw`` holds a number no field can take (beyond
    ±(2^63-1) or with more than 1000 digits), before any decoder or the database meets it."""
    if (error := extreme_number_error(raw)) is not None:
        raise error


def _bare(t: inspect.Type) -> inspect.Type:
    """``t`` without the ``Annotated`` constraints msgspec wraps around it."""
    while isinstance(t, inspect.Metadata):
        t = t.type
    return t


def _struct_of(t: inspect.Type) -> inspect.StructType | None:
    t = _bare(t)
    if isinstance(t, inspect.StructType):
        return t
    if isinstance(t, inspect.UnionType):
        for member in map(_bare, t.types):
            if isinstance(member, inspect.StructType):
                return member
    return None


def _is_decimal(t: inspect.Type) -> bool:
    t = _bare(t)
    if isinstance(t, inspect.DecimalType):
        return True
    if isinstance(t, inspect.UnionType):
        return any(isinstance(_bare(m), inspect.DecimalType) for m in t.types)
    return False


def _walk(t: inspect.StructType, prefix: tuple[str, ...], depth: int) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for field in t.fields:
        path = (*prefix, field.encode_name)
        if _is_decimal(field.type):
            found.append(path)
        elif (sub := _struct_of(field.type)) is not None and depth < 8:
            found.extend(_walk(sub, path, depth + 1))
    return found


def decimal_paths(kind: type[Any]) -> tuple[tuple[str, ...], ...]:
    """JSON paths (through nested Structs) of the ``Decimal`` fields of ``kind``."""
    hashable: Any = kind
    return _decimal_paths(hashable)


@cache
def _decimal_paths(kind: Any) -> tuple[tuple[str, ...], ...]:
    root = _struct_of(inspect.type_info(kind))
    return tuple(_walk(root, (), 0)) if root is not None else ()


def refuse_string_decimals(raw: bytes, kind: type[Any]) -> None:
    """400 when a ``Decimal`` field of ``kind`` holds a JSON string in ``raw``.

    The body is decoded again only when its text could hold one (:func:`_maybe_string_decimal`),
    so a body is usually decoded once, into ``kind``."""
    hashable: Any = kind
    hint = _maybe_string_decimal(hashable)
    if hint is not None and raw and hint.search(raw):
        refuse_string_decimals_in(msgspec.json.decode(raw), kind)


@cache
def _maybe_string_decimal(kind: Any) -> re.Pattern[bytes] | None:
    """Matches wherever a JSON text could give a ``Decimal`` field of ``kind`` a string: a key
    spelled as one of those fields' names followed by a string, or any ``\\u`` escape (a key
    may be spelled with escapes). No match: no such field holds a string. None: no such field."""
    names = sorted({path[-1] for path in decimal_paths(kind)})
    if not names:
        return None
    keys = b"|".join(re.escape(name.encode()) for name in names)
    return re.compile(rb'"(?:' + keys + rb')"\s*:\s*"|\\u')


def refuse_string_decimals_in(doc: Any, kind: type[Any], prefix: str = "") -> None:
    """The same for an already decoded document ``doc`` of ``kind``; the field named in the
    400 starts with ``prefix`` (``members[3].`` for a batch member)."""
    for path in decimal_paths(kind):
        value: Any = doc
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        if isinstance(value, str):
            field = prefix + ".".join(path)
            raise ApiError(400, f"{field}: expected a number, got a string", field)
