"""``respool request ...``: ask for capacity, inspect, release, cancel, delete and prune."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from respool_client.durations import parse_duration
from respool_client.wire import MAX_BATCH, Event, Request, RequestBatch, WhatIf

from cli.api import Api, connect_api
from cli.common import given
from cli.fetch import list_requests, resolve_gang, resolve_request
from cli.maps import parse_decimal, parse_labels, parse_pairs
from cli.options import DEFAULT_URL, Output, OutputFormat, Token, Url
from cli.output import emit, note
from cli.tables import events_table, fmt_map, fmt_time, request_header, requests_table
from cli.wait import wait_until_not_queued

app = typer.Typer(
    help="Resource requests: ask for capacity, follow, release and clean up.",
    no_args_is_help=True,
)

T = TypeVar("T")

RequestId = Annotated[
    str,
    typer.Argument(help="The request's id, or a unique prefix of it (see `respool request list`)."),
]
Attempt = Annotated[
    int | None,
    typer.Option("--attempt", min=1, help="Fencing: act only if this is the current attempt."),
]


PRUNE_BATCH = 10_000


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


def _give_up(api: Api, req: Request, keep_queued: bool, why: str) -> Request:
    if keep_queued:
        note(f"{why}; it stays queued (cancel it with `respool request cancel {req.id}`)")
        return req
    req = api.call("POST", f"/v1/requests/{req.id}/cancel", Request)
    note(f"{why}; request cancelled")
    return req


@app.command("create")
def create(
    subject: Annotated[
        str, typer.Option("--subject", "-s", help="Who asks, e.g. orchestrator:prod.")
    ],
    pool: Annotated[
        str | None,
        typer.Option("--pool", help="Only this pool (default: every pool with a policy)."),
    ] = None,
    gpu: Annotated[int | None, typer.Option("--gpu", min=0, help="GPUs (gpu).")] = None,
    cpu: Annotated[
        Decimal | None,
        typer.Option("--cpu", parser=parse_decimal, help="CPUs, e.g. 0.5 (mcpu = ceil(x*1000))."),
    ] = None,
    memory: Annotated[
        str | None, typer.Option("--memory", help="Memory, e.g. 8GB or 16GiB (memory_mb).")
    ] = None,
    resource: Annotated[
        list[str] | None,
        typer.Option("--resource", "-r", help="Any key, KEY=N; repeat for more (tpu=2)."),
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="KEY=VALUE label; repeat for more.")
    ] = None,
    non_preemptible: Annotated[
        bool,
        typer.Option("--non-preemptible", help="Never preempted; must fit the reserved share."),
    ] = False,
    max_retries: Annotated[
        int | None, typer.Option("--max-retries", min=0, help="Requeues after a preemption.")
    ] = None,
    lease: Annotated[
        int | None,
        typer.Option("--lease", min=1, help="Lease in seconds (default: the server's)."),
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Retries with it get the same request.")
    ] = None,
    max_seconds: Annotated[
        int | None,
        typer.Option(
            "--max-seconds",
            min=1,
            help="Hard runtime cap: expired this many seconds after the grant, heartbeats or not"
            " (lets it backfill while a pool holds for a starving request).",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="What would happen now: status, queue position, message, ETA and what the"
            " reconciler would preempt for it. Nothing is created. Exit 1 if it would be rejected.",
        ),
    ] = False,
    count: Annotated[
        int,
        typer.Option(
            "--count",
            min=1,
            max=MAX_BATCH,
            help="Create this many alike requests in one transaction (a batch, in queue order); "
            "with --idempotency-key K, member i gets the key K-i.",
        ),
    ] = 1,
    gang: Annotated[
        bool,
        typer.Option(
            "--gang",
            "--all-or-nothing",
            help="With --count: the requests are a gang (SPEC §11.6), granted all together in"
            " one pool or not at all, and rejected, preempted, expired and cancelled together.",
        ),
    ] = False,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            help="Wait up to this many seconds for the allocation, with a live status. "
            "Exit code 0 only when allocated.",
        ),
    ] = None,
    keep_queued: Annotated[
        bool,
        typer.Option(
            "--keep-queued", help="With --wait: leave it queued on timeout (default: cancel)."
        ),
    ] = False,
    output: Output = OutputFormat.table,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Ask for capacity. Without --wait, prints the request as created (exit 1 if rejected).

    The request has a lease (--lease seconds; default: the server's, RESPOOL_DEFAULT_LEASE_SECONDS,
    300 s): once allocated, it expires and its units go back unless it is renewed within the
    lease with `respool request heartbeat ID` or released. The command itself does not heartbeat;
    to hold units for a command's whole run, use `respool run -- CMD`.

    Example:

        respool request create -s orchestrator:prod --gpu 2 --cpu 0.5 --memory 8GB --wait 60
        respool request create -s orchestrator:dev --pool training-gpus -r tpu=1 --non-preemptible
        respool request create -s orchestrator:prod --gpu 8 --dry-run
        respool request create -s orchestrator:prod --gpu 2 --count 4 --gang
    """
    settings = given(gpu_count=gpu, cpu_count=cpu, memory=memory)
    body: dict[str, Any] = {"subject": subject, "preemptible": not non_preemptible}
    body |= given(
        pool=pool,
        settings=settings or None,
        resources=parse_pairs(resource or [], "--resource") or None,
        labels=parse_labels(label or []) or None,
        max_retries=max_retries,
        lease_seconds=lease,
        idempotency_key=idempotency_key,
        max_seconds=max_seconds,
    )
    if dry_run:
        _what_if(body, output, url, token)
        return
    if count > 1 or gang:
        if wait is not None:
            raise typer.BadParameter(
                "--wait follows one request; leave it out", param_hint="--count"
            )
        _create_many(body, count, gang, output, url, token)
        return
    with connect_api(url, token) as api:
        req = api.call("POST", "/v1/requests", Request, body=body)
        if wait is not None and req.status == "queued":
            try:
                req = wait_until_not_queued(api, req, wait)
            except KeyboardInterrupt:
                req = _give_up(api, req, keep_queued, "interrupted")
                _show(req, output)
                raise typer.Exit(130) from None
            if req.status == "queued":
                req = _give_up(api, req, keep_queued, f"not allocated within {wait:g}s")
    note(_outcome(req))
    _show(req, output)
    failed = req.status != "allocated" if wait is not None else req.status == "rejected"
    if failed:
        raise typer.Exit(1)


def _what_if(body: dict[str, Any], output: OutputFormat, url: str, token: str | None) -> None:
    """``create --dry-run``: POST /v1/requests?dry_run=true and show the answer."""
    with connect_api(url, token) as api:
        what = api.call("POST", "/v1/requests", WhatIf, body=body, params={"dry_run": "true"})
    note(f"dry run, nothing created: would be {_outcome(what).split(': ', 1)[1]}")
    emit(what, output, lambda: [request_header(what), *would_preempt_lines(what)])
    if what.status == "rejected":
        raise typer.Exit(1)


def would_preempt_lines(what: WhatIf) -> list[str]:
    """The allocations the reconciler would preempt for it, one line each."""
    if not what.would_preempt:
        return ["Would preempt: nothing"]
    return ["Would preempt:"] + [
        f"  {v.id} of {v.subject} in {v.pool}: {fmt_map(v.resources)}" for v in what.would_preempt
    ]


def _create_many(
    body: dict[str, Any],
    count: int,
    gang: bool,
    output: OutputFormat,
    url: str,
    token: str | None,
) -> None:
    """``--count N``: N copies of ``body`` through ``POST /v1/requests/batch`` (exit 1 if any
    is rejected); with ``--gang`` one gang (``all_or_nothing``)."""
    key = body.get("idempotency_key")
    members = [
        body if key is None else {**body, "idempotency_key": f"{key}-{i}"} for i in range(count)
    ]
    with connect_api(url, token) as api:
        batch = {"members": members, "all_or_nothing": gang}
        made = api.call("POST", "/v1/requests/batch", RequestBatch, body=batch).items
    tally = Counter(r.status for r in made)
    what = f"gang {made[0].gang_id}: " if gang and made else ""
    note(f"{what}{len(made)} requests: " + ", ".join(f"{n} {s}" for s, n in sorted(tally.items())))
    emit(made, output, lambda: [requests_table(made)])
    if tally["rejected"]:
        raise typer.Exit(1)


@app.command("list")
def list_(
    pool: Annotated[str | None, typer.Option("--pool", help="Pool name, id or prefix.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="e.g. queued, allocated.")] = None,
    subject: Annotated[str | None, typer.Option("--subject", help="Only this subject.")] = None,
    gang: Annotated[
        str | None,
        typer.Option("--gang", help="Only the members of this gang (its gang_id or a prefix)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 100,
    output: Output = OutputFormat.table,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """List requests, newest first.

    Example:

        respool request list --pool training-gpus --status queued
        respool request list --subject orchestrator:prod -o json
        respool request list --gang 5f0c2a1e
    """
    with connect_api(url, token) as api:
        gang_id = None if gang is None else str(resolve_gang(api, gang))
        found = list_requests(
            api, pool=pool, status=status, subject=subject, gang_id=gang_id, limit=limit
        )
    emit(found, output, lambda: [requests_table(found)])


def _read(url: str, token: str | None, request_id: str, tail: str, kind: type[T]) -> T:
    """GET ``/v1/requests/<id><tail>`` for a request named by id or id prefix."""
    with connect_api(url, token) as api:
        rid = resolve_request(api, request_id)
        return api.call("GET", f"/v1/requests/{rid}{tail}", kind)


@app.command("describe")
def describe(
    request_id: RequestId,
    output: Output = OutputFormat.table,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Show one request: status, reason, queue position, resources, lease.

    Example:

        respool request describe 0b7c1e9e
    """
    _show(_read(url, token, request_id, "", Request), output)


@app.command("events")
def events(
    request_id: RequestId,
    output: Output = OutputFormat.table,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Show a request's history: every status change with its reason.

    Example:

        respool request events 0b7c1e9e
    """
    found = _read(url, token, request_id, "/events", list[Event])
    emit(found, output, lambda: [events_table(found)])


def _action(name: str, doc: str) -> None:
    """Register ``request <name> ID [--attempt N]``: POST /v1/requests/ID/<name>."""

    def command(
        request_id: RequestId,
        attempt: Attempt = None,
        output: Output = OutputFormat.table,
        url: Url = DEFAULT_URL,
        token: Token = None,
    ) -> None:
        with connect_api(url, token) as api:
            rid = resolve_request(api, request_id)
            req = api.call(
                "POST", f"/v1/requests/{rid}/{name}", Request, params={"attempt": attempt}
            )
        note(_outcome(req))
        _show(req, output)

    command.__doc__ = doc
    app.command(name)(command)


_action(
    "release",
    """Give the units back (a queued request is cancelled instead).

    Example:

        respool request release 0b7c1e9e
    """,
)
_action(
    "heartbeat",
    """Renew the lease of an allocated request (now + its lease_seconds); prints its status.

    A script that holds units between commands calls this more often than the lease.

    Example:

        respool request heartbeat 0b7c1e9e --attempt 1
    """,
)
_action(
    "cancel",
    """Cancel a request, queued or allocated.

    Example:

        respool request cancel 0b7c1e9e
    """,
)


@app.command("delete")
def delete(
    request_id: RequestId,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Delete a finished request and its history (refused while it is live).

    Example:

        respool request delete 0b7c1e9e
    """
    with connect_api(url, token) as api:
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
    output: Output = OutputFormat.table,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Delete finished requests older than a duration, with their history (admin only).

    Finished means released, rejected, cancelled, expired or preempted; queued, allocated and
    preempting requests are never touched.

    Example:

        respool request prune --older-than 7d
    """
    with connect_api(url, token) as api:
        # In batches: each call is one short transaction, well under the statement timeout.
        body = {"older_than": older_than, "limit": PRUNE_BATCH}
        result = api.call("POST", "/v1/retention/prune", Pruned, body=body)
        total = result.pruned
        while result.pruned == PRUNE_BATCH:
            result = api.call("POST", "/v1/retention/prune", Pruned, body=body)
            total += result.pruned
        result = Pruned(pruned=total, before=result.before)
    note(f"deleted {result.pruned} requests finished before {fmt_time(result.before)}")
    emit(result, output, lambda: [])
