"""``respool request ...``: ask for capacity, inspect, release, cancel, terminate, delete and
prune."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from respool_client.durations import parse_duration
from respool_client.wire import (
    Event,
    Pool,
    Request,
    RequestBatch,
    RequestBatchCreate,
    RequestCreate,
    RequestTerminate,
    WhatIf,
)

from cli.api import Api, segment
from cli.common import CliError, describe_error
from cli.complete import complete_pool, complete_request, complete_subject
from cli.dry_run import outcome, plan_view
from cli.fetch import LABEL_SCAN, list_requests, resolve_gang, resolve_request
from cli.help import with_examples
from cli.maps import parse_labels
from cli.options import OutputFormat, Remote, Shown, StatusFilter, Typer, check_status
from cli.output import emit, note
from cli.request_options import (
    AllOrNothing,
    Count,
    DryRun,
    Gang,
    IdempotencyKey,
    KeepQueued,
    MaxSeconds,
    RequestFields,
    Subject,
    Wait,
)
from cli.tables import events_table, fmt_time, request_header, requests_table
from cli.wait import wait_until_not_queued
from cli.watch import Watch, watch

app = Typer(
    help="Resource requests: ask for capacity, follow, release and clean up.",
    no_args_is_help=True,
)

T = TypeVar("T")

RequestId = Annotated[
    str,
    typer.Argument(
        help="The request's id, or a unique prefix of it (see `respool request list`).",
        autocompletion=complete_request,
    ),
]
RequestIds = Annotated[
    list[str],
    typer.Argument(
        metavar="ID...",
        help="Request ids, or unique prefixes of them (see `respool request list`).",
        autocompletion=complete_request,
    ),
]
Attempt = Annotated[
    int | None,
    typer.Option("--attempt", min=1, help="Fencing: act only if this is the current attempt."),
]


PRUNE_BATCH = 10_000
# The API's status filter for queued, allocated and preempting together: `request list`'s default.
LIVE = "live"


class Pruned(msgspec.Struct):
    """The answer of ``POST /v1/retention/prune``."""

    pruned: int
    before: datetime


def _show(req: Request, output: OutputFormat) -> None:
    emit(req, output, lambda: [request_header(req)])


def _outcome(req: Request) -> str:
    text: str = req.status
    if req.pool and req.status in ("allocated", "preempting"):
        text += f" in pool {req.pool}"
    if req.reason and req.reason != req.status:
        text += f" ({req.reason})"
    if req.message and req.status != "allocated":
        text += f": {req.message}"
    return f"request {req.id}: {text}"


def _give_up(api: Api, req: Request, keep_queued: bool, why: str) -> tuple[Request, str]:
    """Stop waiting for ``req``: cancel it unless ``keep_queued``; the request as it is now
    and the one line that says what happened."""
    if keep_queued:
        stays = f"it stays queued (cancel it with `respool request cancel {req.id}`)"
        return req, f"request {req.id}: {why}; {stays}"
    req = api.call("POST", f"/v1/requests/{req.id}/cancel", Request)
    if req.status == "cancelled":
        return req, f"request {req.id}: {why}; cancelled"
    return req, _outcome(req)  # granted or ended just before the cancel


@app.command("create")
def create(
    subject: Subject,
    fields: RequestFields,
    idempotency_key: IdempotencyKey = None,
    max_seconds: MaxSeconds = None,
    dry_run: DryRun = False,
    count: Count = 1,
    gang: Gang = False,
    all_or_nothing: AllOrNothing = False,
    wait: Wait = None,
    keep_queued: KeepQueued = False,
    *,
    shown: Shown,
) -> None:
    """Ask for capacity. Without --wait, prints the request as created (exit 1 if rejected).

    The request has a lease (--lease; left out: the server's, RESPOOL_DEFAULT_LEASE_SECONDS,
    300 s; --lease none: no lease): once allocated, it expires and its units go back unless it
    is renewed within the lease with `respool request heartbeat ID` or released. The command
    itself does not heartbeat; to hold units for a command's whole run, use `respool run -- CMD`.

    Example:

        respool request create -s orchestrator:prod --gpu 2 --cpu 0.5 --memory 8GB --wait 60
        respool request create -s orchestrator:dev --pool training-gpus -r tpu=1 --non-preemptible
        respool request create -s orchestrator:prod --gpu 8 --dry-run
        respool request create -s orchestrator:prod --gpu 2 --count 4 --gang
        respool request create -s orchestrator:prod --gpu 4 --selector gpu-type=A100-80G
        respool request create -s orchestrator:prod --gpu 1 --count 3 --group run-42
    """
    gang = gang or all_or_nothing
    many = count > 1 or gang
    _check_combination(many=many, dry_run=dry_run, wait=wait)
    body = fields.body(subject, idempotency_key=idempotency_key, max_seconds=max_seconds)
    if dry_run:
        _what_if(body, shown)
    elif many:
        _create_many(body, count, gang, shown)
    else:
        _create_one(body, wait, keep_queued, shown)


def _check_combination(*, many: bool, dry_run: bool, wait: float | None) -> None:
    """Refuse the options that follow one request when asked for several (exit 2)."""
    if many and dry_run:
        # A what-if answers for one request: for one member of a batch or gang it could say
        # "would be allocated" where the batch itself would be rejected.
        raise typer.BadParameter(
            "a what-if is about one request; leave out --count and --gang", param_hint="--dry-run"
        )
    if many and wait is not None:
        raise typer.BadParameter("--wait follows one request; leave it out", param_hint="--count")


def _create_one(body: RequestCreate, wait: float | None, keep_queued: bool, shown: Shown) -> None:
    """Create one request, wait for its grant if asked, show it (exit 1 unless it went well)."""
    said = None
    with shown.api() as api:
        req = api.call("POST", "/v1/requests", Request, body=body)
        if wait is not None and req.status == "queued":
            req, said = _wait_for_grant(api, req, wait, keep_queued, shown.output)
    note(said or _outcome(req))
    _show(req, shown.output)
    failed = req.status != "allocated" if wait is not None else req.status == "rejected"
    if failed:
        raise typer.Exit(1)


def _wait_for_grant(
    api: Api, req: Request, wait: float, keep_queued: bool, output: OutputFormat
) -> tuple[Request, str | None]:
    """``--wait``: the request once no longer queued; on timeout or Ctrl-C, given up (then
    also the line that says so, in place of the outcome)."""
    try:
        req = wait_until_not_queued(api, req, wait)
    except KeyboardInterrupt:
        req, said = _give_up(api, req, keep_queued, "interrupted")
        note(said)
        _show(req, output)
        raise typer.Exit(130) from None
    if req.status == "queued":
        return _give_up(api, req, keep_queued, f"not allocated within {wait:g}s")
    return req, None


def _what_if(body: RequestCreate, shown: Shown) -> None:
    """``create --dry-run``: POST /v1/requests?dry_run=true, shown as a plan."""
    with shown.api() as api:
        what = api.call("POST", "/v1/requests", WhatIf, body=body, params={"dry_run": "true"})
        grace = None
        if what.would_preempt and what.pool:
            grace = api.call(
                "GET", f"/v1/pools/{segment(what.pool)}", Pool
            ).preemption_grace_seconds
    note(f"dry run, nothing created: {outcome(what, grace)}")
    emit(what, shown.output, lambda: plan_view(what, grace))
    if what.status == "rejected":
        raise typer.Exit(1)


def _members(body: RequestCreate, count: int) -> list[RequestCreate]:
    """``count`` copies of ``body``; with an idempotency key K, member i gets the key K-i."""
    key = body.idempotency_key
    if key is None:
        return [body] * count
    return [msgspec.structs.replace(body, idempotency_key=f"{key}-{i}") for i in range(count)]


def _create_many(body: RequestCreate, count: int, gang: bool, shown: Shown) -> None:
    """``--count N``: N copies of ``body`` through ``POST /v1/requests/batch`` (exit 1 if any
    is rejected); with ``--gang`` one gang (``all_or_nothing``)."""
    batch = RequestBatchCreate(members=_members(body, count), all_or_nothing=gang)
    with shown.api() as api:
        made = api.call("POST", "/v1/requests/batch", RequestBatch, body=batch).items
    tally = Counter(r.status for r in made)
    what = f"gang {made[0].gang_id}: " if gang and made else ""
    note(f"{what}{len(made)} requests: " + ", ".join(f"{n} {s}" for s, n in sorted(tally.items())))
    emit(made, shown.output, lambda: [requests_table(made)])
    if tally["rejected"]:
        raise typer.Exit(1)


@dataclass(frozen=True)
class RequestFilters:
    """``request list``'s filters."""

    pool: Annotated[
        str | None,
        typer.Option("--pool", help="Pool name, id or prefix.", autocompletion=complete_pool),
    ] = None
    status: StatusFilter = None
    every_status: Annotated[
        bool,
        typer.Option(
            "--all",
            "-a",
            help="Finished requests too (released, preempted, expired, cancelled, rejected);"
            " without it and --status, only live ones: queued, allocated, preempting.",
        ),
    ] = False
    subject: Annotated[
        str | None,
        typer.Option("--subject", "-s", help="Only this subject.", autocompletion=complete_subject),
    ] = None
    gang: Annotated[
        str | None,
        typer.Option("--gang", help="Only the members of this gang (its gang_id or a prefix)."),
    ] = None
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            "-l",
            metavar="KEY=VALUE",
            help="Only requests with this label; repeat: all of them. Filtered by the CLI"
            f" among the {LABEL_SCAN} newest requests that match the other filters.",
        ),
    ] = None
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 100

    @property
    def live_only(self) -> bool:
        return not (self.status or self.every_status)

    def query(self) -> dict[str, Any]:
        """The filters as :func:`list_requests` takes them, but the gang (the API resolves its
        prefix); a malformed ``--label`` or ``--status`` is refused here, before any call."""
        labels = parse_labels(self.label or [])
        check_status(self.status)
        status = self.status or (None if self.every_status else LIVE)
        return {"pool": self.pool, "status": status, "subject": self.subject, "labels": labels}


@app.command("list")
def list_(filters: RequestFilters, every: Watch = None, *, shown: Shown) -> None:
    """List live requests (queued, allocated, preempting), newest first; --all adds the
    finished ones. REASON: why a queued request waits, else the reason of its last change.
    NODE: the node it runs on, or ran on last (- in a pool without nodes). -o wide adds LABELS.

    Example:

        respool request list
        respool request list --all -s orchestrator:prod
        respool request list --pool training-gpus --status queued
        respool request list --label team=vision --label run=42 -o wide
        respool request list --status queued --watch 2
        respool request list --gang 5f0c2a1e
    """
    query = filters.query()
    empty = "no requests"
    if filters.live_only:
        empty = "no live requests (--all shows finished ones too)"

    def draw() -> None:
        with shown.api() as api:
            gang = filters.gang
            gang_id = None if gang is None else str(resolve_gang(api, gang))
            found = list_requests(api, gang_id=gang_id, limit=filters.limit, **query)
        emit(found, shown.output, lambda: [requests_table(found, empty=empty)])

    watch(every, shown.output, draw)


def _reader(name: str, tail: str, kind: type[T], view: Callable[[T], Any], doc: str) -> None:
    """Register ``request <name> ID``: GET ``/v1/requests/<id><tail>`` for a request named by
    id or id prefix, shown as ``view`` draws it."""

    def command(request_id: RequestId, *, shown: Shown) -> None:
        with shown.api() as api:
            rid = resolve_request(api, request_id)
            found = api.call("GET", f"/v1/requests/{rid}{tail}", kind)
        emit(found, shown.output, lambda: view(found))

    command.__doc__ = with_examples(doc, f"respool request {name} 0b7c1e9e")
    app.command(name)(command)


_reader(
    "describe",
    "",
    Request,
    lambda req: [request_header(req)],
    "Show one request: status, reason, queue position, resources, lease.",
)
_reader(
    "events",
    "/events",
    list[Event],
    lambda found: [events_table(found)],
    "Show a request's history: every status change with its reason.",
)


def _action(name: str, doc: str) -> None:
    """Register ``request <name> ID... [--attempt N]``: POST /v1/requests/ID/<name> for each id,
    in order. An id that fails is reported on its own line and the others still go ahead;
    exit 1 if any failed."""

    def command(request_ids: RequestIds, attempt: Attempt = None, *, shown: Shown) -> None:
        if attempt is not None and len(request_ids) > 1:
            raise typer.BadParameter("fences one request: give one id", param_hint="--attempt")
        done: list[Request] = []
        failures = 0
        with shown.api() as api:
            for ref in request_ids:
                try:
                    rid = resolve_request(api, ref)
                    req = api.call(
                        "POST", f"/v1/requests/{rid}/{name}", Request, params={"attempt": attempt}
                    )
                except (CliError, typer.BadParameter) as exc:
                    if len(request_ids) == 1:
                        raise
                    failures += 1
                    note(f"error: {ref}: {describe_error(exc)}")
                    continue
                note(_outcome(req))
                done.append(req)
        if len(request_ids) == 1:
            _show(done[0], shown.output)
        else:
            emit(done, shown.output, lambda: [requests_table(done)])
        if failures:
            raise typer.Exit(1)

    command.__doc__ = doc
    app.command(name)(command)


_action(
    "release",
    """Give the units back (a queued request is cancelled instead); several ids: each in turn.

    Example:

        respool request release 0b7c1e9e
        respool request release 0b7c1e9e 5f0c2a1e 9a3d
    """,
)
_action(
    "heartbeat",
    """Renew the lease of allocated requests (now + each one's lease_seconds); prints each status.

    A script that holds units between commands calls this more often than the lease.

    Example:

        respool request heartbeat 0b7c1e9e --attempt 1
    """,
)
_action(
    "cancel",
    """Cancel requests, queued or allocated; several ids: each in turn.

    Example:

        respool request cancel 0b7c1e9e
        respool request cancel 0b7c1e9e 5f0c2a1e
    """,
)


@app.command("terminate")
def terminate(
    request_id: RequestId,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Also a non-preemptible allocation; a request already preempting ends at once.",
        ),
    ] = False,
    reason: Annotated[
        str,
        typer.Option("--reason", metavar="TEXT", help="Why: shown in the request's message."),
    ] = "",
    *,
    shown: Shown,
) -> None:
    """End a request as a preemption would; it is never requeued (admin only).

    An allocated request goes through preempting with its pool's grace period (none: preempted
    at once) and its holder is told to release; a non-preemptible one needs --force. With
    --force a request already preempting is preempted at once. A queued request is cancelled;
    a finished one is left as it is. Reason code: terminated.

    Example:

        respool request terminate 0b7c1e9e --reason "node maintenance"
        respool request terminate 0b7c1e9e --force
    """
    body = RequestTerminate(force=force, reason=reason)
    with shown.api() as api:
        rid = resolve_request(api, request_id)
        req = api.call("POST", f"/v1/requests/{rid}/terminate", Request, body=body)
    note(_outcome(req))
    _show(req, shown.output)


@app.command("delete")
def delete(request_id: RequestId, *, remote: Remote) -> None:
    """Delete a finished request and its history (refused while it is live).

    Example:

        respool request delete 0b7c1e9e
    """
    with remote.api() as api:
        rid = resolve_request(api, request_id)
        api.call("DELETE", f"/v1/requests/{rid}")
    note(f"deleted request {rid}")


def _duration(text: str) -> str:
    try:
        parse_duration(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return text.strip()


@app.command("prune")
def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            parser=_duration,
            metavar="DURATION",
            help="Finished longer ago than this: 90s, 30m, 12h, 7d.",
        ),
    ],
    *,
    shown: Shown,
) -> None:
    """Delete finished requests older than a duration, with their history (admin only).

    Finished means released, rejected, cancelled, expired or preempted; queued, allocated and
    preempting requests are never touched.

    Example:

        respool request prune --older-than 7d
    """
    with shown.api() as api:
        # In batches: each call is one short transaction, well under the statement timeout.
        body = {"older_than": older_than, "limit": PRUNE_BATCH}
        result = api.call("POST", "/v1/retention/prune", Pruned, body=body)
        total = result.pruned
        while result.pruned == PRUNE_BATCH:
            result = api.call("POST", "/v1/retention/prune", Pruned, body=body)
            total += result.pruned
        result = Pruned(pruned=total, before=result.before)
    note(f"deleted {result.pruned} requests finished before {fmt_time(result.before)}")
    emit(result, shown.output, lambda: [])
