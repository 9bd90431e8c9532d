"""Reads over the API that several commands share (paged request lists, id prefixes)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from uuid import UUID

import typer
from respool_client.wire import Request, RequestPage

from cli.api import Api
from cli.common import CliError

__all__ = ["RequestPage", "list_requests", "resolve_gang", "resolve_request"]

PAGE = 500
# How many of the most recent requests an id prefix is looked up in.
PREFIX_SCAN = 5000
# How many requests (matching the server's filters) a label filter looks through.
LABEL_SCAN = 5000
_PREFIX = re.compile(r"[0-9a-f][0-9a-f-]{3,35}")


def list_requests(
    api: Api,
    *,
    limit: int,
    pool: str | None = None,
    subject: str | None = None,
    status: str | None = None,
    gang_id: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[Request]:
    """Up to ``limit`` requests, newest first, following the API's cursors.

    ``labels`` (every pair must match) are filtered here, as the API has no such filter:
    among the :data:`LABEL_SCAN` newest requests that match the other filters."""
    out: list[Request] = []
    cursor: str | None = None
    read = 0
    while len(out) < limit:
        page = api.call(
            "GET",
            "/v1/requests",
            RequestPage,
            params={
                "pool": pool,
                "subject": subject,
                "status": status,
                "gang_id": gang_id,
                "limit": PAGE if labels else min(PAGE, limit - len(out)),
                "cursor": cursor,
            },
        )
        read += len(page.items)
        out.extend(r for r in page.items if not labels or _has_labels(r, labels))
        cursor = page.next_cursor
        if cursor is None or (labels and read >= LABEL_SCAN):
            break
    return out[:limit]


def _has_labels(request: Request, labels: Mapping[str, str]) -> bool:
    return all(request.labels.get(k) == v for k, v in labels.items())


def resolve_request(api: Api, ref: str) -> UUID:
    """A full request id, or a unique prefix (>= 4 hex, as tables show) of a recent one."""
    return _resolve(ref, "request id", lambda: [r.id for r in _recent(api)])


def resolve_gang(api: Api, ref: str) -> UUID:
    """A full gang id, or a unique prefix (>= 4 hex) of the gang of a recent request."""
    return _resolve(ref, "gang id", lambda: {r.gang_id for r in _recent(api) if r.gang_id})


def _recent(api: Api) -> list[Request]:
    return list_requests(api, limit=PREFIX_SCAN)


def _resolve(ref: str, what: str, known: Callable[[], Iterable[UUID]]) -> UUID:
    """``ref`` as a full id, else the one id of ``known()`` it is a prefix of."""
    try:
        return UUID(ref)
    except ValueError:
        pass
    prefix = ref.strip().lower()
    if not _PREFIX.fullmatch(prefix):
        raise typer.BadParameter(f"{ref!r} is not a {what} or an id prefix (>= 4 hex)")
    found = sorted(i for i in known() if str(i).startswith(prefix))
    if len(found) == 1:
        return found[0]
    if not found:
        raise CliError(
            f"no {what} starts with {prefix} among the {PREFIX_SCAN} most recent requests; "
            "give the full id"
        )
    shown = ", ".join(str(i) for i in found[:5]) + (", ..." if len(found) > 5 else "")
    raise CliError(f"{what} prefix {prefix} is ambiguous: {shown}")
