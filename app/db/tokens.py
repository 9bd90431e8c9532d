"""Typed wrappers around the token functions (sql/functions/060_tokens.sql).

A token is ``rp_`` plus 43 URL-safe characters (256 random bits). Only its sha256 hex reaches
the database: :func:`create_token` hashes in Python, and :func:`verify_token` looks up by hash.

Client tokens carry subject *globs*: ``*`` matches any run of characters, ``?`` one character,
everything else is literal (``team-a:*``). :func:`glob_to_like` turns them into SQL LIKE
patterns (for ``list_requests``) and :func:`subject_matches` matches in Python.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Literal
from uuid import UUID

import msgspec

from app.db.errors import engine_errors
from app.db.queries import Executor, _as

__all__ = [
    "Role",
    "Token",
    "create_token",
    "glob_to_like",
    "hash_token",
    "list_tokens",
    "new_token",
    "request_subject",
    "revoke_token",
    "subject_matches",
    "tokens_exist",
    "verify_token",
]

Role = Literal["admin", "client", "reader"]


class Token(msgspec.Struct, frozen=True):
    id: UUID
    name: str
    role: Role
    subject_patterns: list[str] | None
    created_at: datetime
    revoked_at: datetime | None


def new_token() -> str:
    """A fresh random token text (shown once to its owner, never stored)."""
    return "rp_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of a token: lower-case hex sha256 of its UTF-8 text."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def glob_to_like(pattern: str) -> str:
    """``team-a:*`` → ``team-a:%``; LIKE's own ``%``, ``_`` and ``\\`` are escaped."""
    out = []
    for ch in pattern:
        if ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        elif ch in "%_\\":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts = [".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern]
    return re.compile("".join(parts), re.DOTALL)


def subject_matches(subject: str, patterns: Sequence[str]) -> bool:
    """Whether ``subject`` matches any of the globs (the whole subject, case-sensitive)."""
    return any(_glob_regex(p).fullmatch(subject) for p in patterns)


@engine_errors
async def create_token(
    db: Executor,
    *,
    name: str,
    role: Role,
    subject_patterns: Sequence[str] | None = None,
    token: str | None = None,
) -> tuple[str, Token]:
    """Register a token; returns ``(token_text, token)``. The text is not recoverable later."""
    text = token if token is not None else new_token()
    doc = await db.fetchval(
        "SELECT respool.create_token(p_name => $1, p_role => $2, p_token_hash => $3,"
        " p_subject_patterns => $4)",
        name,
        role,
        hash_token(text),
        list(subject_patterns) if subject_patterns is not None else None,
    )
    return text, _as(Token, doc)


@engine_errors
async def verify_token(db: Executor, token: str) -> Token | None:
    """The active token with this text, or None (unknown or revoked)."""
    doc = await db.fetchval("SELECT respool.verify_token(p_token_hash => $1)", hash_token(token))
    return None if doc is None else _as(Token, doc)


@engine_errors
async def tokens_exist(db: Executor) -> bool:
    return bool(await db.fetchval("SELECT respool.tokens_exist()"))


@engine_errors
async def list_tokens(db: Executor, *, include_revoked: bool = False) -> list[Token]:
    doc = await db.fetchval("SELECT respool.list_tokens(p_include_revoked => $1)", include_revoked)
    return _as(list[Token], doc)


@engine_errors
async def revoke_token(db: Executor, ref: str) -> Token:
    """Revoke by id or by the name of an active token (NotFound otherwise)."""
    return _as(Token, await db.fetchval("SELECT respool.revoke_token(p_ref => $1)", ref))


@engine_errors
async def request_subject(db: Executor, request_id: UUID) -> str | None:
    """The request's subject, or None when the request does not exist."""
    value = await db.fetchval("SELECT respool.request_subject(p_id => $1)", request_id)
    return None if value is None else str(value)
