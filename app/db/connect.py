"""asyncpg connections and pools with respool's codecs and application names."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec

__all__ = [
    "APP_API",
    "APP_CLI",
    "APP_LISTENER",
    "APP_RECONCILER",
    "connect",
    "create_pool",
    "init_connection",
]

# application_name values, visible in pg_stat_activity (SPEC §8).
APP_API = "respool-api"
APP_LISTENER = "respool-listener"
APP_RECONCILER = "respool-reconciler"
APP_CLI = "respool-cli"

# Decimals go out as JSON numbers, so a cpu_count of 8.05 reaches SQL exactly as written.
_encoder = msgspec.json.Encoder(decimal_format="number")


def _encode_json(value: Any) -> str:
    return _encoder.encode(value).decode()


def _decode_json(text: str | bytes) -> Any:
    return msgspec.json.decode(text)


async def init_connection(conn: asyncpg.Connection) -> None:
    """Register json/jsonb codecs: Python values in, Python values out (via msgspec)."""
    for typename in ("jsonb", "json"):
        await conn.set_type_codec(
            typename,
            schema="pg_catalog",
            encoder=_encode_json,
            decoder=_decode_json,
            format="text",
        )


async def connect(
    dsn: str, *, application_name: str, connect_timeout: float = 10.0
) -> asyncpg.Connection:
    """Open one connection to ``dsn`` tagged with ``application_name``."""
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn,
        timeout=connect_timeout,
        server_settings={"application_name": application_name},
    )
    try:
        await init_connection(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


async def create_pool(
    dsn: str, *, size: int, application_name: str, connect_timeout: float = 10.0
) -> asyncpg.Pool:
    """Create a pool of up to ``size`` connections tagged with ``application_name``."""
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min(size, 2),
        max_size=size,
        timeout=connect_timeout,
        init=init_connection,
        server_settings={"application_name": application_name},
    )
    assert pool is not None
    return pool
