"""The defaults a create body declares (the wire type RequestCreate) are the ones the engine
fills (respool._create_body), the one place the server fills them."""

from __future__ import annotations

import json

import asyncpg
import msgspec
import pytest
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


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"subject": "s", "pool": 3}', "pool"),
        ('{"subject": "s", "resources": [1]}', "resources"),
        ('{"subject": "s", "settings": "8GB"}', "settings"),
        ('{"subject": "s", "labels": 5}', "labels"),
        ('{"subject": "s", "node_selector": ["a"]}', "node_selector"),
        ('{"subject": "s", "idempotency_key": 7}', "idempotency_key"),
        # several wrong: the first in the order pool, resources, settings, labels, node_selector
        ('{"subject": "s", "labels": 5, "resources": true, "node_selector": 1}', "resources"),
    ],
)
async def test_a_field_of_the_wrong_type_is_rp400_naming_it(
    conn: asyncpg.Connection, body: str, field: str
) -> None:
    with pytest.raises(asyncpg.PostgresError) as err:
        await conn.fetchval("SELECT respool._create_body($1::jsonb, 300)", json.loads(body))
    assert err.value.sqlstate == "RP400"
    assert err.value.column_name == field
    assert field in str(err.value)
