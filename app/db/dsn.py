"""Which database to talk to."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from app.settings import Settings

__all__ = ["resolve_database_url", "redact_dsn", "with_database"]


def resolve_database_url(settings: Settings) -> str:
    """``RESPOOL_DATABASE_URL`` if set, else an embedded server in the user's data directory."""
    if settings.database_url:
        return settings.database_url
    from app.db.embedded import embedded_database_url

    return embedded_database_url()


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for messages and logs)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparsable DSN>"
    if parts.password:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    return urlunsplit(parts)


def with_database(dsn: str, database: str) -> str:
    """The same server DSN, pointing at another database (URI form only)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError("expected a postgresql:// URI")
    return urlunsplit(parts._replace(path="/" + database))
