"""The defaults a create body declares (the wire type RequestCreate) are the ones the engine
fills (respool._create_body), the one place the server fills them."""

from __future__ import annotations

import asyncpg
import msgspec
from respool_client.wire import RequestCreate


async def test_the_engine_fills_the_declared_defaults(conn: asyncpg.Connection) -> None:
    filled = await conn.fetchval(
        'SELECT respool._create_body(\'{"subject": "s"}\', p_default_lease_seconds => 300)'
    )
    declared = msgspec.to_builtins(RequestCreate(subject="s"))  # UNSET lease: left out
    assert filled["lease_seconds"] == 300  # absent: the server's default lease
    for name, value in declared.items():
        if value is not None:  # null and absent are the same to the engine
            assert filled[name] == value, name
    assert set(filled) <= set(RequestCreate.__struct_fields__)
    # an explicit null lease stays null (no lease)
    none = await conn.fetchval(
        'SELECT respool._create_body(\'{"subject": "s", "lease_seconds": null}\', 300)'
    )
    assert none["lease_seconds"] is None
