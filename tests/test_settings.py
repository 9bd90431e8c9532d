from __future__ import annotations

import pytest
from respool_client.durations import format_duration, parse_duration

from app.settings import Settings, SettingsError


def test_defaults() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert s.database_url is None
    assert (s.host, s.port) == ("127.0.0.1", 8080)
    assert s.reconcile_interval == 1.0
    assert s.default_lease_seconds == 300
    assert s.max_wait == 25.0
    assert s.db_pool_size == 10
    assert s.admin_token is None
    assert s.auth == "on" and s.auth_enabled
    assert s.log_level == "INFO"
    assert s.retention is None


def test_all_values() -> None:
    s = Settings.from_env(
        {
            "RESPOOL_DATABASE_URL": "postgresql://u:p@h/db",
            "RESPOOL_HOST": "0.0.0.0",
            "RESPOOL_PORT": "9000",
            "RESPOOL_RECONCILE_INTERVAL": "0.25",
            "RESPOOL_DEFAULT_LEASE_SECONDS": "60",
            "RESPOOL_MAX_WAIT": "0",
            "RESPOOL_DB_POOL_SIZE": "3",
            "RESPOOL_ADMIN_TOKEN": "sekrit-0123456789abcdef0123456789",
            "RESPOOL_AUTH": "OFF",
            "RESPOOL_LOG_LEVEL": "debug",
            "RESPOOL_RETENTION": "7d",
            "UNRELATED": "x",
        }
    )
    assert s.database_url == "postgresql://u:p@h/db"
    assert s.host == "0.0.0.0"
    assert s.port == 9000
    assert s.reconcile_interval == 0.25
    assert s.default_lease_seconds == 60
    assert s.max_wait == 0.0
    assert s.db_pool_size == 3
    assert s.admin_token == "sekrit-0123456789abcdef0123456789"
    assert s.auth == "off" and not s.auth_enabled
    assert s.log_level == "DEBUG"
    assert s.retention == 7 * 86400


def test_empty_values_mean_unset() -> None:
    s = Settings.from_env(
        {"RESPOOL_DATABASE_URL": "", "RESPOOL_PORT": " ", "RESPOOL_RETENTION": ""}
    )
    assert s == Settings()


def test_max_pending() -> None:
    # Default: a burst of as many calls as the server accepts connections waits in line.
    assert Settings.from_env({}).max_pending == 20_000 == Settings().max_connections
    assert Settings.from_env({"RESPOOL_MAX_PENDING": " 50 "}).max_pending == 50
    assert Settings.from_env({"RESPOOL_MAX_PENDING": ""}).max_pending == 20_000


def test_settings_are_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("RESPOOL_PORT", "abc"),
        ("RESPOOL_PORT", "0"),
        ("RESPOOL_PORT", "70000"),
        ("RESPOOL_RECONCILE_INTERVAL", "0"),
        ("RESPOOL_RECONCILE_INTERVAL", "fast"),
        ("RESPOOL_RECONCILE_INTERVAL", "nan"),
        ("RESPOOL_DEFAULT_LEASE_SECONDS", "1.5"),
        ("RESPOOL_DEFAULT_LEASE_SECONDS", "-1"),
        ("RESPOOL_MAX_WAIT", "-2"),
        ("RESPOOL_DB_POOL_SIZE", "0"),
        ("RESPOOL_AUTH", "maybe"),
        ("RESPOOL_LOG_LEVEL", "loud"),
        ("RESPOOL_RETENTION", "7x"),
        ("RESPOOL_RETENTION", "0"),
        ("RESPOOL_RETENTION", "-5"),
        ("RESPOOL_MAX_PENDING", "0"),
        ("RESPOOL_MAX_PENDING", "many"),
        ("RESPOOL_MAX_PENDING", "1000001"),
    ],
)
def test_bad_value_names_the_variable(var: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({var: value})
    message = str(info.value)
    assert message.startswith(f"{var}: ")
    assert "\n" not in message
    assert repr(value) in message or value in message


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("12h", 43200.0),
        ("7d", 604800.0),
        ("2w", 1209600.0),
        ("1h30m", 5400.0),
        (" 1D ", 86400.0),
        ("0.5h", 1800.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "7x", "d", "-1", "1h-30m", "inf", "nan", "1 h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [(86400, "1d"), (5400, "1h30m"), (1.5, "1.5s")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
