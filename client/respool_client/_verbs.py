"""The plain API calls on requests (create, get, heartbeat, list, release, cancel), one HTTP
call each (retries included), answers decoded into the wire types."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

import msgspec
from respool_client._transport import Transport, poll_timeout
from respool_client.wire import (
    JobRelease,
    Request,
    RequestBatch,
    RequestBatchCreate,
    RequestCreate,
    RequestPage,
)

__all__ = ["RequestVerbs", "new_request"]


def new_request(subject: str, **fields: Any) -> RequestCreate:
    """The create body for ``subject`` with the keyword ``fields`` of
    :class:`~respool_client.wire.RequestCreate` (a misspelt field is a ``TypeError``), and a
    fresh idempotency key unless one is given.

    A field left out takes the server's default; ``lease_seconds=None`` is an explicit null on
    the wire: no lease (leaving it out means the server's default lease)."""
    for name in ("resources", "labels", "node_selector"):
        value = fields.get(name)
        if isinstance(value, Mapping) and not isinstance(value, dict):
            fields[name] = dict(value)
    body = RequestCreate(subject=subject, **fields)
    if not body.idempotency_key:
        body = msgspec.structs.replace(body, idempotency_key=str(uuid.uuid4()))
    return body


class RequestVerbs(Transport):
    """The calls on requests that :class:`~respool_client.AsyncRespool` offers."""

    async def _request(self, method: str, path: str, **kw: Any) -> Request:
        return msgspec.convert(await self.call(method, path, **kw), Request, strict=False)

    async def create_request(
        self, subject: str, *, wait: float | None = None, **fields: Any
    ) -> Request:
        """Create (or, with the same ``idempotency_key``, replay) a request.

        ``fields`` are those of :class:`~respool_client.wire.RequestCreate` (``pool``,
        ``resources``, ``settings``, ``preemptible``, ``max_retries``, ``max_seconds``,
        ``lease_seconds``, ``idempotency_key``, ``labels``, ``node_selector``,
        ``preemption_group``): left out, the server's default; ``lease_seconds=None`` asks for no
        lease; ``preemption_group="run-42"``: it never preempts an allocation of that group
        (docs/preemption.md). ``wait``: answer once the
        request is no longer queued, or after that many seconds."""
        return await self._request(
            "POST",
            "/v1/requests",
            params={"wait": wait},
            body=new_request(subject, **fields),
            http_timeout=poll_timeout(wait),
        )

    async def create_many(
        self, members: Sequence[RequestCreate], *, all_or_nothing: bool = False
    ) -> list[Request]:
        """Create 1 to 1,000 requests in one transaction (``POST /v1/requests/batch``).

        Each member is an ordinary create body, created as a single create would be (granted
        where it fits, else queued, or rejected), in member order, which is also their queue
        order; the answers come back in that order. A member without an idempotency key gets a
        fresh one, so a retried batch never creates twice. A malformed member refuses the whole
        batch: :class:`ApiError` naming ``members[i].field``, and nothing is created.

        ``all_or_nothing=True`` makes the members a gang (``docs/scheduling.md``): same subject,
        pool, preemptible and max_retries; one ``gang_id``; granted all together in one pool or
        not at all; rejected, preempted, expired and cancelled together.
        """
        fresh = msgspec.structs.replace
        keyed = [
            m if m.idempotency_key else fresh(m, idempotency_key=str(uuid.uuid4())) for m in members
        ]
        answer = await self.call(
            "POST",
            "/v1/requests/batch",
            body=RequestBatchCreate(members=keyed, all_or_nothing=all_or_nothing),
        )
        return msgspec.convert(answer, RequestBatch, strict=False).items

    async def get_request(
        self, request_id: UUID | str, *, wait: float | None = None, version: int | None = None
    ) -> Request:
        return await self._request(
            "GET",
            f"/v1/requests/{request_id}",
            params={"wait": wait, "version": version},
            http_timeout=poll_timeout(wait),
        )

    async def heartbeat(
        self,
        request_id: UUID | str,
        attempt: int | None = None,
        *,
        within: float | None = None,
        lease_seconds: int | None = None,
        queue_lease_seconds: int | None = None,
        usage: Mapping[str, int] | None = None,
    ) -> Request:
        """Extend the lease to now + ``lease_seconds`` (default: the request's); queued: set the
        queue lease to now + ``queue_lease_seconds`` (default: the same length), which an
        allocated request ignores; ``within``: give up (retries included) after this many
        seconds. ``usage``: what the holder of a slice uses now, ``{"gpu_memory_mb": N}``
        (docs/placement.md, "Sharing a GPU")."""
        return await self._request(
            "POST",
            f"/v1/requests/{request_id}/heartbeat",
            params={
                "attempt": attempt,
                "lease_seconds": lease_seconds,
                "queue_lease_seconds": queue_lease_seconds,
            },
            body=None if usage is None else {"usage": dict(usage)},
            retry_for=within,
            http_timeout=None if within is None else min(self.request_timeout, max(within, 1.0)),
        )

    async def list_requests(
        self,
        *,
        pool: str | None = None,
        subject: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        gang_id: UUID | str | None = None,
    ) -> RequestPage:
        """One page of requests, newest first (``next_cursor`` pages on); ``gang_id``: the
        members of one gang."""
        params: dict[str, Any] = {"pool": pool, "subject": subject, "status": status}
        params["gang_id"] = None if gang_id is None else str(gang_id)
        params |= {"limit": limit, "cursor": cursor}
        doc = await self.call("GET", "/v1/requests", params=params)
        return msgspec.convert(doc, RequestPage, strict=False)

    async def release(
        self,
        request_id: UUID | str,
        attempt: int | None = None,
        *,
        used: Mapping[str, int] | None = None,
    ) -> Request:
        """Release (queued: cancel); ``used``: the units of rate keys really used, which
        settle the request's charges first (docs/rates.md)."""
        if used is None:
            return await self._act(request_id, "release", attempt)
        return await self._request(
            "POST",
            f"/v1/requests/{request_id}/release",
            params={"attempt": attempt},
            body=JobRelease(used=dict(used)),
        )

    async def cancel(self, request_id: UUID | str, attempt: int | None = None) -> Request:
        return await self._act(request_id, "cancel", attempt)

    async def _act(self, request_id: UUID | str, action: str, attempt: int | None) -> Request:
        return await self._request(
            "POST", f"/v1/requests/{request_id}/{action}", params={"attempt": attempt}
        )
