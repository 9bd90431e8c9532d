"""Shell completion of what the API knows: pool names, subjects, request ids; and statuses.

Each completer asks the API once with a short timeout (the URL and token as the command line
so far, the environment or the default give them) and completes nothing when it cannot: a
shell's completion never waits long or prints an error."""

from __future__ import annotations

import os
from typing import Any

import typer
from respool_client.wire import STATUSES, Node, Policy, Pool, RequestPage

from cli.api import connect_api

__all__ = [
    "TIMEOUT",
    "complete_node",
    "complete_pool",
    "complete_request",
    "complete_status",
    "complete_subject",
]

TIMEOUT = 1.0  # seconds, per completion
RECENT = 200  # request ids offered: the newest this many


def _get(ctx: typer.Context, path: str, kind: Any, **params: Any) -> Any:
    """``GET path`` as ``kind``, or None when the API cannot answer at once."""
    url = ctx.params.get("url") or os.environ.get("RESPOOL_URL") or "http://127.0.0.1:8080"
    token = ctx.params.get("token") or os.environ.get("RESPOOL_TOKEN")
    try:
        with connect_api(url, token, timeout=TIMEOUT) as api:
            return api.call("GET", path, kind, params=params or None, timeout=TIMEOUT)
    except Exception:  # noqa: BLE001 - completion fails silently, whatever the cause
        return None


def complete_pool(ctx: typer.Context, incomplete: str) -> list[str]:
    pools: list[Pool] = _get(ctx, "/v1/pools", list[Pool]) or []
    return sorted(p.name for p in pools if p.name.startswith(incomplete))


def complete_subject(ctx: typer.Context, incomplete: str) -> list[str]:
    """The subjects of the policies, and those a pattern policy serves now."""
    policies: list[Policy] = _get(ctx, "/v1/policies", list[Policy]) or []
    found = {p.subject for p in policies if "*" not in p.subject}
    found |= {s for p in policies for s in p.covers}
    return sorted(s for s in found if s.startswith(incomplete))


def complete_request(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Short ids of the newest requests, with their subject and status as help."""
    page: RequestPage | None = _get(ctx, "/v1/requests", RequestPage, limit=RECENT)
    items = page.items if page else []
    return [
        (str(r.id)[:8], f"{r.subject} {r.status}")
        for r in items
        if str(r.id).startswith(incomplete.lower())
    ]


def complete_node(ctx: typer.Context, incomplete: str) -> list[str]:
    nodes: list[Node] = _get(ctx, "/v1/nodes", list[Node]) or []
    return sorted(n.name for n in nodes if n.name.startswith(incomplete))


def complete_status(incomplete: str) -> list[str]:
    return [s for s in STATUSES if s.startswith(incomplete)]
