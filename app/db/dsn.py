"""Which database to talk to."""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from app.settings import Settings

__all__ = [
    "hosts",
    "primary_only",
    "redact_dsn",
    "resolve_database_url",
    "split_password",
    "with_database",
]

# ``password=...`` in a key/value DSN (``host=db password='a b'``) or a URI's query string.
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)")


def resolve_database_url(settings: Settings) -> str:
    """``RESPOOL_DATABASE_URL`` if set, else an embedded server in the user's data directory."""
    if settings.database_url:
        return settings.database_url
    from app.db.embedded import embedded_database_url

    return embedded_database_url()


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for messages and logs): the URI's
    ``user:password@``, a ``password=`` query parameter or key/value setting."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparsable DSN>"
    if parts.scheme not in ("postgres", "postgresql"):
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    if parts.password:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    return urlunsplit(parts._replace(query=_KEYWORD_PASSWORD.sub(r"\1***", parts.query)))


def split_password(dsn: str) -> tuple[str, str | None]:
    """A URI DSN without its password, and the password (None: the DSN has none), so that a
    client can get it in ``PGPASSWORD`` rather than on a command line others can read. Other
    DSNs come back unchanged."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return dsn, None
    if parts.scheme not in ("postgres", "postgresql"):
        return dsn, None
    password: str | None = None
    if parts.password:
        password = unquote(parts.password)
        user = parts.netloc.rpartition("@")[0].partition(":")[0]
        parts = parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}")
    kept = []
    for item in parts.query.split("&") if parts.query else []:
        name, _, value = item.partition("=")
        if name == "password":
            password = unquote(value)
        else:
            kept.append(item)
    return urlunsplit(parts._replace(query="&".join(kept))), password


def with_database(dsn: str, database: str) -> str:
    """The same server DSN, pointing at another database (URI form only)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError("expected a postgresql:// URI")
    return urlunsplit(parts._replace(path="/" + database))


def hosts(dsn: str) -> list[str]:
    """The ``host[:port]`` entries of a URI DSN (several for a multi-host DSN, in order)."""
    try:
        netloc = urlsplit(dsn).netloc
    except ValueError:
        return []
    return [h for h in netloc.rpartition("@")[2].split(",") if h]


def primary_only(dsn: str) -> dict[str, Any]:
    """Connect options that keep a multi-host DSN on the primary.

    A DSN that lists several hosts (``postgresql://h1:p1,h2:p2/db``) and says nothing about
    ``target_session_attrs`` (nor does ``PGTARGETSESSIONATTRS``) gets ``read-write``: respool
    writes, so a standby is never the right server. An explicit setting is kept as written.
    """
    if len(hosts(dsn)) < 2 or os.environ.get("PGTARGETSESSIONATTRS"):
        return {}
    try:
        query = parse_qs(urlsplit(dsn).query)
    except ValueError:
        return {}
    if "target_session_attrs" in query:
        return {}
    return {"target_session_attrs": "read-write"}
