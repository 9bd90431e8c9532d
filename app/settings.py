"""Service configuration, read from ``RESPOOL_*`` environment variables (SPEC §9)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar

import msgspec

from app.durations import parse_duration

__all__ = ["Settings", "SettingsError", "LOG_LEVELS"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

T = TypeVar("T")


class SettingsError(ValueError):
    """A configuration value is invalid; the message is one line naming the variable."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    database_url: str | None = None
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
            host=get("RESPOOL_HOST", str, "127.0.0.1"),
            port=get("RESPOOL_PORT", _int_range(1, 65535), 8080),
            reconcile_interval=get("RESPOOL_RECONCILE_INTERVAL", _positive_seconds, 1.0),
            default_lease_seconds=get("RESPOOL_DEFAULT_LEASE_SECONDS", _int_range(1, None), 300),
            max_wait=get("RESPOOL_MAX_WAIT", _non_negative_seconds, 25.0),
            db_pool_size=get("RESPOOL_DB_POOL_SIZE", _int_range(1, 1000), 10),
            admin_token=get("RESPOOL_ADMIN_TOKEN", _optional_str, None),
            auth=get("RESPOOL_AUTH", _on_off, "on"),
            log_level=get("RESPOOL_LOG_LEVEL", _log_level, "INFO"),
            log_format=get("RESPOOL_LOG_FORMAT", _log_format, "text"),
            retention=get("RESPOOL_RETENTION", _retention, None),
        )


def _optional_str(raw: str) -> str | None:
    return raw


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


def _on_off(raw: str) -> Literal["on", "off"]:
    value = raw.lower()
    if value == "on":
        return "on"
    if value == "off":
        return "off"
    raise ValueError(f"expected 'on' or 'off', got {raw!r}")


def _log_level(raw: str) -> str:
    value = raw.upper()
    if value not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return value


def _log_format(raw: str) -> Literal["text", "json"]:
    value = raw.lower()
    if value == "text":
        return "text"
    if value == "json":
        return "json"
    raise ValueError(f"expected 'text' or 'json', got {raw!r}")


def _retention(raw: str) -> float:
    value = parse_duration(raw)
    if value <= 0:
        raise ValueError(f"expected a positive duration such as 7d, 12h, 30m or 90s, got {raw!r}")
    return value
