"""Resource maps and the ResourceSettings conversion, done once, in SQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from engine_support import mk_policy, mk_pool, mk_req

from app.db import requests as db_requests
from app.db.errors import BadInput
from support.db import direct


@pytest.fixture(scope="module")
async def mconn(module_db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """One connection for the pure-function tests of this module (they store nothing)."""
    async with direct(module_db_url) as c:
        yield c


async def convert(conn: asyncpg.Connection, settings_json: str) -> dict[str, int]:
    """settings_to_resources on JSON text, so decimals reach SQL exactly as written."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT respool.settings_to_resources($1::text::jsonb)", settings_json
    )


async def build(
    conn: asyncpg.Connection, resources: str | None, settings: str | None
) -> dict[str, int]:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT respool.build_resources($1::text::jsonb, $2::text::jsonb)", resources, settings
    )


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ('{"gpu_count": 2}', {"gpu": 2}),
        ('{"cpu_count": 0.5}', {"mcpu": 500}),
        ('{"cpu_count": 8.05}', {"mcpu": 8050}),  # 8.05 * 1000 = 8050.000000000001 as a float
        ('{"cpu_count": 1.0001}', {"mcpu": 1001}),
        ('{"cpu_count": 1}', {"mcpu": 1000}),
        ('{"cpu_count": 0.0001}', {"mcpu": 1}),
        ('{"cpu_count": 2.3}', {"mcpu": 2300}),
        ('{"cpu_count": 1e-3}', {"mcpu": 1}),
        ('{"memory": "8GB"}', {"memory_mb": 8000}),
        ('{"memory": "1GiB"}', {"memory_mb": 1074}),
        ('{"memory": "16GiB"}', {"memory_mb": 17180}),
        ('{"memory": "512MiB"}', {"memory_mb": 537}),
        ('{"memory": "1.5GB"}', {"memory_mb": 1500}),
        ('{"memory": "1KB"}', {"memory_mb": 1}),
        ('{"memory": "1KiB"}', {"memory_mb": 1}),
        ('{"memory": "250MB"}', {"memory_mb": 250}),
        ('{"memory": "2TB"}', {"memory_mb": 2_000_000}),
        ('{"memory": "1TiB"}', {"memory_mb": 1_099_512}),
        ('{"memory": "1PB"}', {"memory_mb": 1_000_000_000}),
        ('{"memory": "1PiB"}', {"memory_mb": 1_125_899_907}),
        # Kubernetes quantity suffixes: G is 10^9 bytes (not Slurm's 1024-based G), Gi is 2^30
        ('{"memory": "8G"}', {"memory_mb": 8000}),
        ('{"memory": "8Gi"}', {"memory_mb": 8590}),
        ('{"memory": "1.5G"}', {"memory_mb": 1500}),
        ('{"memory": "512Mi"}', {"memory_mb": 537}),
        ('{"memory": "512M"}', {"memory_mb": 512}),
        ('{"memory": "1K"}', {"memory_mb": 1}),
        ('{"memory": "1Ki"}', {"memory_mb": 1}),
        ('{"memory": "2T"}', {"memory_mb": 2_000_000}),
        ('{"memory": "1Ti"}', {"memory_mb": 1_099_512}),
        ('{"memory": "1P"}', {"memory_mb": 1_000_000_000}),
        ('{"memory": "1Pi"}', {"memory_mb": 1_125_899_907}),
        ('{"memory": " 16 Gi "}', {"memory_mb": 17180}),
        ('{"pool_resources": {"tpu": 4, "licence_x": 1}}', {"tpu": 4, "licence_x": 1}),
        # typed fields override the same keys given in pool_resources
        (
            '{"pool_resources": {"gpu": 5, "mcpu": 7, "memory_mb": 9, "tpu": 1},'
            ' "gpu_count": 1, "cpu_count": 2, "memory": "3GB"}',
            {"gpu": 1, "mcpu": 2000, "memory_mb": 3000, "tpu": 1},
        ),
        (
            '{"gpu_count": 1, "cpu_count": 0.25, "memory": "2GB"}',
            {"gpu": 1, "mcpu": 250, "memory_mb": 2000},
        ),
        ('{"gpu_count": null, "cpu_count": null, "memory": null}', {}),
        ("{}", {}),
    ],
)
async def test_settings_to_resources(
    mconn: asyncpg.Connection, settings: str, expected: dict[str, int]
) -> None:
    assert await convert(mconn, settings) == expected


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ('{"memory": "8gb"}', "settings.memory"),  # units are case-sensitive
        ('{"memory": "8Gb"}', "settings.memory"),
        ('{"memory": "8GIB"}', "settings.memory"),
        ('{"memory": "8g"}', "settings.memory"),
        ('{"memory": "8gi"}', "settings.memory"),
        ('{"memory": "8GI"}', "settings.memory"),
        ('{"memory": "8iB"}', "settings.memory"),
        ('{"memory": "8GBi"}', "settings.memory"),
        ('{"memory": "8E"}', "settings.memory"),
        ('{"memory": "8B"}', "settings.memory"),
        ('{"memory": "8"}', "settings.memory"),
        ('{"memory": "GB"}', "settings.memory"),
        ('{"memory": "-1GB"}', "settings.memory"),
        ('{"memory": "8XB"}', "settings.memory"),
        ('{"memory": 8000}', "settings.memory"),
        ('{"gpu_count": 1.5}', "settings.gpu_count"),
        ('{"gpu_count": -1}', "settings.gpu_count"),
        ('{"gpu_count": "2"}', "settings.gpu_count"),
        ('{"gpu_count": 9223372036854775808}', "settings.gpu_count"),
        ('{"cpu_count": -0.5}', "settings.cpu_count"),
        ('{"cpu_count": "1"}', "settings.cpu_count"),
        ('{"cpu_count": 1e30}', "settings.cpu_count"),
        ('{"pool_resources": {"tpu": -1}}', "settings.pool_resources.tpu"),
        ('{"pool_resources": {"Tpu": 1}}', "settings.pool_resources.Tpu"),
        ('{"pool_resources": [1]}', "settings.pool_resources"),
        ('{"gpus": 1}', "settings.gpus"),  # not a ResourceSettings field
        ('{"memory_mb": 100}', "settings.memory_mb"),
        ("[1, 2]", "settings"),
        ('"8GB"', "settings"),
    ],
)
async def test_bad_settings(mconn: asyncpg.Connection, settings: str, field: str) -> None:
    with pytest.raises(asyncpg.PostgresError) as err:
        await convert(mconn, settings)
    assert err.value.sqlstate == "RP400"
    assert err.value.column_name == field
    assert field.split(".")[-1] in str(err.value)


@pytest.mark.parametrize(
    ("resources", "settings", "expected"),
    [
        (None, None, {"step_run": 1}),
        ('{"gpu": 2}', None, {"gpu": 2, "step_run": 1}),
        # zeros are dropped, from resources and from settings
        ('{"gpu": 0, "tpu": 3}', None, {"tpu": 3, "step_run": 1}),
        (None, '{"gpu_count": 0, "cpu_count": 0, "pool_resources": {"tpu": 0}}', {"step_run": 1}),
        # settings win over resources; keys only in resources are kept
        (
            '{"gpu": 4, "mcpu": 100, "tpu": 1}',
            '{"gpu_count": 2, "cpu_count": 1.5}',
            {"gpu": 2, "mcpu": 1500, "tpu": 1, "step_run": 1},
        ),
        ('{"tpu": 4}', '{"pool_resources": {"tpu": 1}}', {"tpu": 1, "step_run": 1}),
        # a typed settings field of 0 wins too, and the zero is then dropped
        ('{"gpu": 3}', '{"gpu_count": 0}', {"step_run": 1}),
        # the largest amount (respool_client.wire.MAX_AMOUNT) is kept as is
        ('{"gpu": 1000000000000000}', None, {"gpu": 1000000000000000, "step_run": 1}),
    ],
)
async def test_build_resources(
    mconn: asyncpg.Connection, resources: str | None, settings: str | None, expected: dict[str, int]
) -> None:
    assert await build(mconn, resources, settings) == expected


@pytest.mark.parametrize(
    ("resources", "settings", "field"),
    [
        ('{"step_run": 1}', None, "resources.step_run"),
        ('{"step_run": 0}', None, "resources.step_run"),
        (None, '{"pool_resources": {"step_run": 1}}', "resources.step_run"),
        ('{"gpu": -1}', None, "resources.gpu"),
        ('{"gpu": 1.5}', None, "resources.gpu"),
        ('{"gpu": "1"}', None, "resources.gpu"),
        ('{"gpu": true}', None, "resources.gpu"),
        ('{"gpu": null}', None, "resources.gpu"),
        ('{"gpu": 9223372036854775808}', None, "resources.gpu"),
        ('{"gpu": 1e100}', None, "resources.gpu"),
        ('{"GPU": 1}', None, "resources.GPU"),
        ('{"1gpu": 1}', None, "resources.1gpu"),
        ('{"gpu-x": 1}', None, "resources.gpu-x"),
        ('{"": 1}', None, "resources."),
        ('{"' + "k" * 64 + '": 1}', None, "resources." + "k" * 64),
        ("[1]", None, "resources"),
        ("3", None, "resources"),
        ('{"gpu": 1}', '{"gpu_count": -2}', "settings.gpu_count"),
        (None, '{"cpus": 2}', "settings.cpus"),
    ],
)
async def test_bad_resources(
    mconn: asyncpg.Connection, resources: str | None, settings: str | None, field: str
) -> None:
    with pytest.raises(asyncpg.PostgresError) as err:
        await build(mconn, resources, settings)
    assert err.value.sqlstate == "RP400"
    assert err.value.column_name == field


async def test_longest_key_is_fine(mconn: asyncpg.Connection) -> None:
    key = "k" * 63
    assert await build(mconn, json.dumps({key: 1}), None) == {key: 1, "step_run": 1}


@pytest.fixture
async def open_pool(conn: asyncpg.Connection) -> asyncpg.Connection:
    """A pool that tracks nothing but gpu and tpu, and a subject allowed on it."""
    await mk_pool(conn, "p", {"gpu": 8, "tpu": 8})
    await mk_policy(conn, "team", "p")
    return conn


@pytest.mark.parametrize(
    ("resources", "settings", "expected"),
    [
        (
            None,
            {"gpu_count": 2, "cpu_count": 8.05, "memory": "16GiB"},
            {"gpu": 2, "mcpu": 8050, "memory_mb": 17180, "step_run": 1},
        ),
        (None, {"cpu_count": 1.0001}, {"mcpu": 1001, "step_run": 1}),
        (None, {"cpu_count": Decimal("8.05")}, {"mcpu": 8050, "step_run": 1}),
        (None, {"cpu_count": Decimal("1.0001")}, {"mcpu": 1001, "step_run": 1}),
        (None, {"cpu_count": Decimal("0.5")}, {"mcpu": 500, "step_run": 1}),
        (
            None,
            {"cpu_count": 0.5, "pool_resources": {"tpu": 2, "mcpu": 9}},
            {"mcpu": 500, "tpu": 2, "step_run": 1},
        ),
        ({"gpu": 4, "tpu": 1}, {"gpu_count": 1}, {"gpu": 1, "tpu": 1, "step_run": 1}),
        ({"gpu": 0, "tpu": 1}, None, {"tpu": 1, "step_run": 1}),
        (None, None, {"step_run": 1}),
    ],
)
async def test_create_request_stores_the_final_map(
    open_pool: asyncpg.Connection,
    resources: dict[str, Any] | None,
    settings: dict[str, Any] | None,
    expected: dict[str, int],
) -> None:
    r = await mk_req(open_pool, "team", "p", resources=resources, settings=settings)
    assert r.status == "allocated"
    assert r.resources == expected
    stored = await open_pool.fetchval("SELECT resources FROM respool.requests WHERE id = $1", r.id)
    assert stored == expected


async def test_python_floats_reach_sql_as_written(mconn: asyncpg.Connection) -> None:
    # The jsonb codec (msgspec) writes a float's shortest repr, so 8.05 arrives as 8.05 and the
    # decimal ceil gives 8050, not 8051.
    sent = await mconn.fetchval("SELECT ($1::jsonb -> 'cpu_count')::text", {"cpu_count": 8.05})
    assert sent == "8.05"
    assert await mconn.fetchval(
        "SELECT respool.settings_to_resources($1)", {"cpu_count": 8.05}
    ) == {"mcpu": 8050}


@pytest.mark.parametrize("value", ["8.05", "1.0001", "0.1", "12345678901234567890.123"])
async def test_decimals_reach_sql_as_json_numbers(mconn: asyncpg.Connection, value: str) -> None:
    # A Decimal must arrive as a JSON number with its digits (decimal_format="number" in the
    # codec); as a string, settings.cpu_count would be refused.
    raw = await mconn.fetchval(
        "SELECT ($1::jsonb -> 'cpu_count')::text", {"cpu_count": Decimal(value)}
    )
    assert raw == value


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"resources": {"step_run": 1}}, "resources.step_run"),
        ({"settings": {"pool_resources": {"step_run": 2}}}, "resources.step_run"),
        ({"resources": {"gpu": -1}}, "resources.gpu"),
        ({"resources": {"gpu": 0.5}}, "resources.gpu"),
        ({"resources": {"gpu": 2**63}}, "resources.gpu"),
        ({"resources": {"gpu": 10**15 + 1}}, "resources.gpu"),  # beyond MAX_AMOUNT
        ({"resources": {"bad key": 1}}, "resources.bad key"),
        ({"settings": {"memory": "4gb"}}, "settings.memory"),
        ({"settings": {"gpu": 1}}, "settings.gpu"),
        ({"settings": {"cpu_count": -1}}, "settings.cpu_count"),
        ({"labels": {"run": 1}}, "labels.run"),
        ({"max_retries": -1}, "max_retries"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"idempotency_key": ""}, "idempotency_key"),
    ],
)
async def test_malformed_create_is_not_stored(
    open_pool: asyncpg.Connection, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(BadInput) as err:
        await db_requests.create_request(open_pool, dict(subject="team", pool="p", **kwargs))
    assert err.value.field == field
    assert err.value.status_code == 400
    assert await open_pool.fetchval("SELECT count(*) FROM respool.requests") == 0


async def test_bad_subject_is_bad_input(open_pool: asyncpg.Connection) -> None:
    with pytest.raises(BadInput) as err:
        await db_requests.create_request(open_pool, {"subject": "-bad subject", "pool": "p"})
    assert err.value.field == "subject"
