"""API tokens (``sql/queries/tokens.sql``): typed wrappers around sql/functions/060_tokens.sql.

A token is ``rp_`` plus 43 URL-safe characters (256 random bits). Only its sha256 hex reaches
the database: :func:`create_token` hashes in Python, and :func:`verify_token` looks up by hash.

Client tokens carry subject *globs*, matched by :mod:`app.globs`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Literal
from uuid import UUID

import msgspec

from app.db.errors import engine_errors
from app.db.executor import Executor, _as
from app.db.named import query

__all__ = [
    "Role",
    "Token",
    "create_token",
    "hash_token",
    "list_tokens",
    "new_token",
    "request_subject",
    "revoke_token",
    "tokens_exist",
    "verify_token",
]

Role = Literal["admin", "client", "reader", "agent"]


class Token(msgspec.Struct, frozen=True):
    id: UUID
    name: str
    role: Role
    subject_patterns: list[str] | None
    created_at: datetime
    revoked_at: datetime | None
    # an agent token's binding (docs/jobs.md): one node, or one pool without nodes
    node: str | None = None
    node_id: UUID | None = None
    pool: str | None = None
    pool_id: UUID | None = None


def new_token() -> str:
    """A fresh random token text (shown once to its owner, never stored)."""
    return "rp_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of a token: lower-case hex sha256 of its UTF-8 text."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@engine_errors
async def create_token(
    db: Executor,
    *,
    name: str,
    role: Role,
    subject_patterns: Sequence[str] | None = None,
    token: str | None = None,
    node: str | None = None,
    pool: str | None = None,
) -> tuple[str, Token]:
    """Register a token; returns ``(token_text, token)``. The text is not recoverable later.
    An agent token is bound to ``node`` or to ``pool`` (a pool without nodes)."""
    text = token if token is not None else new_token()
    doc = await db.fetchval(
        query("create_token"),
        name,
        role,
        hash_token(text),
        list(subject_patterns) if subject_patterns is not None else None,
        node,
        pool,
    )
    return text, _as(Token, doc)


@engine_errors
async def verify_token(db: Executor, token: str) -> Token | None:
    """The active token with this text, or None (unknown or revoked)."""
    doc = await db.fetchval(query("verify_token"), hash_token(token))
    return None if doc is None else _as(Token, doc)


@engine_errors
async def tokens_exist(db: Executor) -> bool:
    return bool(await db.fetchval(query("tokens_exist")))


@engine_errors
async def list_tokens(db: Executor, *, include_revoked: bool = False) -> list[Token]:
    doc = await db.fetchval(query("list_tokens"), include_revoked)
    return _as(list[Token], doc)


@engine_errors
async def revoke_token(db: Executor, ref: str) -> Token:
    """Revoke by id or by the name of an active token (NotFound otherwise)."""
    return _as(Token, await db.fetchval(query("revoke_token"), ref))


@engine_errors
async def request_subject(db: Executor, request_id: UUID) -> str | None:
    """The request's subject, or None when the request does not exist."""
    value = await db.fetchval(query("request_subject"), request_id)
    return None if value is None else str(value)
