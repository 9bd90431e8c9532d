"""``respool token ...``: API tokens, managed directly in the database (RESPOOL_DATABASE_URL)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Annotated

import msgspec
import typer

from app.db import tokens
from app.db.tokens import Role, Token
from cli.database import database, run_async
from cli.fit import FitTable
from cli.options import Output, OutputFormat
from cli.output import emit, note
from cli.tables import fmt_time, table

app = typer.Typer(
    help="API tokens (admin, client, reader, agent). Talks to the database, not to the API.",
    no_args_is_help=True,
)


class NewToken(msgspec.Struct, kw_only=True):
    """A created token: ``token`` is its text, shown this once and never stored."""

    token: str
    id: str
    name: str
    role: str
    subject_patterns: list[str] | None
    node: str | None = None  # an agent token's node, by name (docs/jobs.md)
    pool: str | None = None  # its pool without nodes, or the pool its node is registered in


async def _create(
    name: str, role: Role, subjects: list[str] | None, node: str | None, pool: str | None
) -> tuple[str, Token]:
    async with database() as conn:
        return await tokens.create_token(
            conn, name=name, role=role, subject_patterns=subjects, node=node, pool=pool
        )


async def _list(include_revoked: bool) -> list[Token]:
    async with database() as conn:
        return await tokens.list_tokens(conn, include_revoked=include_revoked)


async def _revoke(ref: str) -> Token:
    async with database() as conn:
        return await tokens.revoke_token(conn, ref)


@app.command("create")
def create(
    role: Annotated[Role, typer.Option("--role", help="admin, client, reader or agent.")],
    subject: Annotated[
        list[str] | None,
        typer.Option(
            "--subject",
            help="Client tokens: subjects they may act for, globs allowed (team-a:*); repeat.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="A unique name (default: ROLE-<random>).")
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(
            "--node",
            help="Agent tokens: the node (by name) whose jobs it runs, and the only node it may"
            " register or update; it need not be registered yet (then give --pool).",
        ),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            "--pool",
            help="Agent tokens: a pool without nodes whose jobs it runs; with --node, the pool its"
            " agent registers the node in (an existing node's own pool, the default).",
        ),
    ] = None,
    output: Output = OutputFormat.table,
) -> None:
    """Create a token and print it once (only its hash is stored).

    Example:

        respool token create --role admin --name ops
        respool token create --role client --subject 'orchestrator:prod*' --name prod-stack
        respool token create --role agent --node gpu-1 --name agent-gpu-1
        respool token create --role agent --node gpu-2 --pool training --name agent-gpu-2
    """
    name = name or f"{role}-{secrets.token_hex(3)}"
    text, tok = run_async(_create(name, role, subject or None, node, pool))
    shown = NewToken(
        token=text,
        id=str(tok.id),
        name=tok.name,
        role=tok.role,
        subject_patterns=tok.subject_patterns,
        node=tok.node,
        pool=tok.pool,
    )
    note(f"created {tok.role} token {tok.name!r}; store it now, it is not shown again")
    emit(shown, output, lambda: [tokens_table([tok]), text])


@app.command("list")
def list_(
    all_: Annotated[bool, typer.Option("--all", help="Include revoked tokens.")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """List tokens (never their text).

    Example:

        respool token list --all
    """
    found = run_async(_list(all_))
    emit(found, output, lambda: [tokens_table(found)])


@app.command("revoke")
def revoke(
    ref: Annotated[str, typer.Argument(help="The token's id or name.")],
    output: Output = OutputFormat.table,
) -> None:
    """Revoke a token; the API refuses it from the next call on.

    Example:

        respool token revoke prod-stack
    """
    tok = run_async(_revoke(ref))
    note(f"revoked token {tok.name!r}")
    emit(tok, output, lambda: [tokens_table([tok])])


def _binding(t: Token) -> str:
    """An agent token's binding: ``node gpu-1 (pool p)``, ``pool cpu``; ``-`` for the others."""
    if t.node:
        return f"node {t.node}" + (f" (pool {t.pool})" if t.pool else "")
    return f"pool {t.pool}" if t.pool else "-"


def tokens_table(found: Sequence[Token]) -> FitTable:
    """The tokens, one row each (never their secret)."""
    out = table("ID", "NAME", "ROLE", "SUBJECTS", "CREATED", "REVOKED")
    for t in found:
        out.add_row(
            str(t.id),
            t.name,
            t.role,
            " ".join(t.subject_patterns or []) or _binding(t),
            fmt_time(t.created_at),
            fmt_time(t.revoked_at),
        )
    return out
