"""Two corrections to what Litestar 2 generates, so the OpenAPI document and the HTTP answers
tell the truth (checked by tests/api/test_schemathesis.py).

* :class:`ClosedStructSchemaPlugin`: a msgspec Struct with ``forbid_unknown_fields`` (every
  request body) is declared with ``additionalProperties: false``; Litestar leaves it open. It
  also restores integer bounds Litestar drops when they are 0 (``ge=0``).
* :func:`answer_options`: the automatic ``OPTIONS`` handler of a path with several handlers
  lists only some of its methods in ``Allow`` (litestar-org/litestar#4169, fixed in v3 only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.spec import Schema
from litestar.routes import HTTPRoute
from litestar.status_codes import HTTP_204_NO_CONTENT

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator
    from litestar.typing import FieldDefinition

__all__ = ["ClosedStructSchemaPlugin", "answer_options"]


class ClosedStructSchemaPlugin(StructSchemaPlugin):
    """``additionalProperties: false`` for Structs that refuse unknown fields."""

    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        if not super().is_plugin_supported_field(field_definition):
            return False
        kind: type[msgspec.Struct] = field_definition.type_
        return bool(kind.__struct_config__.forbid_unknown_fields)

    def to_openapi_schema(
        self, field_definition: FieldDefinition, schema_creator: SchemaCreator
    ) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        schema.additional_properties = False
        info = msgspec.inspect.type_info(field_definition.type_)
        assert isinstance(info, msgspec.inspect.StructType)
        for field in info.fields:
            prop = (schema.properties or {}).get(field.encode_name)
            bounds = _int_bounds(field.type)
            if isinstance(prop, Schema) and bounds is not None:
                low, high = bounds
                if low is not None and prop.minimum is None:
                    prop.minimum = low
                if high is not None and prop.maximum is None:
                    prop.maximum = high
        return schema


def _int_bounds(kind: msgspec.inspect.Type) -> tuple[int | None, int | None] | None:
    """(minimum, maximum) of an integer field, also inside ``X | None``."""
    if isinstance(kind, msgspec.inspect.UnionType):
        ints = [t for t in kind.types if isinstance(t, msgspec.inspect.IntType)]
        if len(ints) != 1:
            return None
        kind = ints[0]
    if not isinstance(kind, msgspec.inspect.IntType):
        return None
    low = kind.ge if kind.ge is not None else (kind.gt + 1 if kind.gt is not None else None)
    high = kind.le if kind.le is not None else (kind.lt - 1 if kind.lt is not None else None)
    return low, high


async def answer_options(request: Request[Any, Any, Any]) -> Response[None] | None:
    """``before_request``: answer ``OPTIONS`` with every method of the matched path (async:
    Litestar runs a synchronous hook in a worker thread, for every request)."""
    if request.method != "OPTIONS":
        return None
    template = request.scope.get("path_template")
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, HTTPRoute) and route.path_format == template:
            methods.update(route.methods)
    if not methods:
        return None
    return Response(
        None, status_code=HTTP_204_NO_CONTENT, headers={"Allow": ", ".join(sorted(methods))}
    )
