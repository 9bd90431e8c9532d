"""Service configuration, read from ``RESPOOL_*`` environment variables (README)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar

import msgspec
from respool_client.durations import parse_duration

__all__ = ["Settings", "SettingsError", "LOG_LEVELS"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

T = TypeVar("T")


class SettingsError(ValueError):
    """A configuration value is invalid; the message is one line naming the variable."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    database_url: str | None = None
    # Where respool keeps its own data: the embedded PostgreSQL's data directory is
    # ``<data_dir>/pgdata`` (None: the user's data directory, app.db.embedded.default_data_dir).
    data_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    reconcile_interval: float = 1.0
    default_lease_seconds: int = 300
    max_wait: float = 25.0
    db_pool_size: int = 10
    admin_token: str | None = None
    auth: Literal["on", "off"] = "on"
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
    retention: float | None = None
    # Hardening (docs/ops.md, "Limits"): /metrics protection and cache, connection limits.
    metrics_token: str | None = None
    metrics_cache_seconds: float = 5.0
    max_connections: int = 20_000
    max_waits: int = 20_000
    max_waits_per_token: int = 10_000
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    # API processes of `respool serve` on one port (docs/ops.md, "Workers").
    workers: int = 1
    # Backpressure (docs/api.md, "Backpressure"): calls that may wait for a database connection
    # (creates waiting to be coalesced included) before one is refused with 429.
    max_pending: int = 20_000
    # Bytes of a job's output kept per attempt: head and tail halves (docs/jobs.md).
    log_limit: int = 1_048_576

    @property
    def auth_enabled(self) -> bool:
        return self.auth == "on"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``env`` (default: ``os.environ``); empty values count as unset."""
        if env is None:
            env = os.environ

        def get(name: str, parse: Callable[[str], T], default: T) -> T:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return parse(raw)
            except ValueError as exc:
                raise SettingsError(f"{name}: {exc}") from None

        return cls(
            database_url=get("RESPOOL_DATABASE_URL", _optional_str, None),
            data_dir=get("RESPOOL_DATA_DIR", data_dir_value, None),
            host=get("RESPOOL_HOST", str, "127.0.0.1"),
            port=get("RESPOOL_PORT", _int_range(1, 65535), 8080),
            reconcile_interval=get("RESPOOL_RECONCILE_INTERVAL", _positive_seconds, 1.0),
            default_lease_seconds=get("RESPOOL_DEFAULT_LEASE_SECONDS", _int_range(1, None), 300),
            max_wait=get("RESPOOL_MAX_WAIT", _non_negative_seconds, 25.0),
            db_pool_size=get("RESPOOL_DB_POOL_SIZE", _int_range(1, 1000), 10),
            admin_token=get("RESPOOL_ADMIN_TOKEN", _admin_token, None),
            auth=get("RESPOOL_AUTH", _on_off, "on"),
            log_level=get("RESPOOL_LOG_LEVEL", _log_level, "INFO"),
            log_format=get("RESPOOL_LOG_FORMAT", _log_format, "text"),
            retention=get("RESPOOL_RETENTION", _retention, None),
            metrics_token=get("RESPOOL_METRICS_TOKEN", _secret, None),
            metrics_cache_seconds=get("RESPOOL_METRICS_CACHE_SECONDS", _non_negative_seconds, 5.0),
            max_connections=get("RESPOOL_MAX_CONNECTIONS", _int_range(1, 1_000_000), 20_000),
            max_waits=get("RESPOOL_MAX_WAITS", _int_range(1, 1_000_000), 20_000),
            max_waits_per_token=get(
                "RESPOOL_MAX_WAITS_PER_TOKEN", _int_range(1, 1_000_000), 10_000
            ),
            header_timeout=get("RESPOOL_HEADER_TIMEOUT", _positive_seconds, 10.0),
            body_timeout=get("RESPOOL_BODY_TIMEOUT", _positive_seconds, 30.0),
            workers=get("RESPOOL_WORKERS", _int_range(1, MAX_WORKERS), 1),
            max_pending=get("RESPOOL_MAX_PENDING", _int_range(1, 1_000_000), 20_000),
            log_limit=get("RESPOOL_LOG_LIMIT", _int_range(1024, 1 << 30), 1_048_576),
        )


# Most API processes `respool serve --workers` runs.
MAX_WORKERS = 64


def _optional_str(raw: str) -> str | None:
    return raw


def data_dir_value(raw: str) -> str:
    """``RESPOOL_DATA_DIR``: a directory path (``~`` expanded; a relative path is relative to
    the working directory when respool starts)."""
    return os.path.abspath(os.path.expanduser(raw))


# A secret shorter than this is refused: 32 characters of a random token are >= 128 bits.
MIN_SECRET_LENGTH = 32

# Placeholders shipped in deploy/ (.env.example, k8s/secret.yaml): never accepted as secrets.
EXAMPLE_SECRETS = frozenset({"change-me-to-a-long-random-string", "change-me"})


def _secret(raw: str) -> str:
    if raw in EXAMPLE_SECRETS or raw.lower().startswith("change-me"):
        raise ValueError(
            "still the example value from deploy/; generate a token, e.g. "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    if len(raw) < MIN_SECRET_LENGTH:
        raise ValueError(
            f"too short ({len(raw)} characters); use at least {MIN_SECRET_LENGTH}, e.g. "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return raw


def _admin_token(raw: str) -> str | None:
    return _secret(raw)


def _int_range(low: int, high: int | None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise ValueError(f"expected an integer {bound}, got {raw!r}")
        return value

    return parse


def _number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number of seconds, got {raw!r}")
    return value


def _positive_seconds(raw: str) -> float:
    value = _number(raw)
    if value <= 0:
        raise ValueError(f"expected a positive number of seconds, got {raw!r}")
    return value


def _non_negative_seconds(raw: str) -> float:
    value = _number(raw)
    if value < 0:
        raise ValueError(f"expected a non-negative number of seconds, got {raw!r}")
    return value


_Word = TypeVar("_Word", bound=str)


def _one_of(raw: str, words: tuple[_Word, ...]) -> _Word:
    value = raw.lower()
    for word in words:
        if value == word:
            return word
    raise ValueError(f"expected {' or '.join(repr(w) for w in words)}, got {raw!r}")


def _on_off(raw: str) -> Literal["on", "off"]:
    return _one_of(raw, ("on", "off"))


def _log_level(raw: str) -> str:
    value = raw.upper()
    if value not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return value


def _log_format(raw: str) -> Literal["text", "json"]:
    return _one_of(raw, ("text", "json"))


def _retention(raw: str) -> float:
    value = parse_duration(raw)
    if value <= 0:
        raise ValueError(f"expected a positive duration such as 7d, 12h, 30m or 90s, got {raw!r}")
    return value
