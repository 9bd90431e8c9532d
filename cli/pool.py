"""``respool pool ...``: pools and their subject policies (the shape of ``zenml resource-pool``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import msgspec
import typer
from respool_client.durations import parse_duration
from respool_client.wire import (
    MAX_RATE_SECONDS,
    MAX_SECONDS,
    Node,
    Ordering,
    PlacementMode,
    Policy,
    Pool,
    Queueing,
    Request,
    SliceOveruse,
)
from rich.console import RenderableType
from rich.text import Text

from cli import policy
from cli.api import Api, segment
from cli.common import confirm, given_of
from cli.fetch import list_requests
from cli.options import Description, Force, PoolRef, Remote, Shown, Typer, Yes, map_option
from cli.output import emit, note
from cli.tables import (
    nodes_table,
    placed_table,
    policies_table,
    pool_header,
    pool_keys_table,
    pools_table,
    requests_table,
)
from cli.watch import Watch, watch

app = Typer(
    help="Pools of capacity and the subject policies that draw from them.",
    no_args_is_help=True,
)
app.add_typer(policy.app)  # attach-policy, detach-policy, list-policies


class View(StrEnum):
    queued = "queued"
    active = "active"
    all = "all"


Limit = Annotated[int, typer.Option("--limit", min=1, help="At most this many requests.")]
ViewOpt = Annotated[
    View,
    typer.Option(
        "--view", help="queued (in grant order), active (holding units) or all (newest first)."
    ),
]
NewPoolName = Annotated[
    str, typer.Argument(help="Pool name: lower-case letters, digits, '.', '_' and '-'.")
]

OFF = "off"


def parse_rate(text: str) -> str:
    """``--rate KEY=AMOUNT/WINDOW`` (``llm_tokens=2000000/60s``, the window in seconds or a
    duration such as ``1m``), or ``KEY=off`` (update: no rate key any more); checked here, sent
    as given to :func:`rates_body`."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise typer.BadParameter("give KEY=AMOUNT/WINDOW, e.g. llm_tokens=2000000/60s, or KEY=off")
    if value.strip().lower() == OFF:
        return text
    amount, slash, window = value.partition("/")
    try:
        seconds = parse_duration(window) if slash else -1.0
        ok = amount.strip().isdigit() and seconds == int(seconds) and seconds >= 1
    except ValueError:
        ok = False
    if not ok or seconds > MAX_RATE_SECONDS:
        raise typer.BadParameter(
            f"{text!r}: give KEY=AMOUNT/WINDOW, e.g. llm_tokens=2000000/60s (a window of 1 s to"
            f" {MAX_RATE_SECONDS} s), or KEY=off"
        )
    return text


def rates_body(rates: list[str]) -> dict[str, Any]:
    """The ``rates`` of a pool body from ``--rate`` values (docs/rates.md)."""
    body: dict[str, Any] = {}
    for text in rates:
        key, _, value = text.partition("=")
        if value.strip().lower() == OFF:
            body[key.strip()] = None
            continue
        amount, _, window = value.partition("/")
        body[key.strip()] = {"amount": int(amount), "per_seconds": int(parse_duration(window))}
    return body


Rates = Annotated[
    list[str] | None,
    typer.Option(
        "--rate",
        parser=parse_rate,
        metavar="KEY=AMOUNT/WINDOW",
        help="A rate key: AMOUNT units per sliding WINDOW (e.g. llm_tokens=2000000/1m), back"
        " with time, not on release; repeat for more; KEY=off removes one (update).",
    ),
]


def parse_starvation(text: str) -> str:
    """``--starvation-seconds``: a whole number of seconds >= 0, or ``off``."""
    value = text.strip().lower()
    if value == OFF or (value.isdigit() and int(value) <= MAX_SECONDS):
        return value
    raise typer.BadParameter(f"give seconds (0 to {MAX_SECONDS}) or 'off'")


@dataclass(frozen=True)
class PoolFields:
    """The options that set a pool's fields, create's and update's."""

    capacity: Annotated[
        dict[str, int] | None,
        map_option(
            "-c",
            "--capacity",
            help="""Capacity per key, JSON or YAML: '{"gpu": 8, "step_run": 32}'.""",
        ),
    ] = None
    description: Description = None
    queueing: Annotated[
        Queueing | None,
        typer.Option("--queueing", help="best_effort grants whatever fits; strict keeps order."),
    ] = None
    grace: Annotated[
        int | None, typer.Option("--grace", min=0, help="Preemption grace period in seconds.")
    ] = None
    starvation: Annotated[
        str | None,
        typer.Option(
            "--starvation-seconds",
            parser=parse_starvation,
            metavar="SECONDS|off",
            help="best_effort: after the queue head waited this long, hold free units for it"
            " (backfill only with max_seconds); 'off' disables. Default 300.",
        ),
    ] = None
    ordering: Annotated[
        Ordering | None,
        typer.Option(
            "--ordering",
            help="fifo: queue time; fair: lower dominant share first at equal priority.",
        ),
    ] = None
    placement: Annotated[
        PlacementMode | None,
        typer.Option(
            "--placement",
            help="Pools with nodes: pack fills the busiest node that fits (keeps whole machines"
            " free), spread the emptiest. Default pack.",
        ),
    ] = None
    slice_overuse: Annotated[
        SliceOveruse | None,
        typer.Option(
            "--slice-overuse",
            help="Use above a slice of a shared GPU (reported with heartbeats): report records"
            " an over_slice event, terminate also ends the holding. Default report.",
        ),
    ] = None
    rate: Rates = None

    def body(self) -> dict[str, Any]:
        """The fields given but the capacity, as the API names them."""
        names = ("description", "queueing", "ordering", "placement", "slice_overuse")
        body = given_of(self, *names, preemption_grace_seconds="grace")
        if (
            self.starvation is not None
        ):  # off is sent as null: the guard is off (docs/scheduling.md)
            body["starvation_seconds"] = None if self.starvation == OFF else int(self.starvation)
        if self.rate:  # rate keys (docs/rates.md)
            body["rates"] = rates_body(self.rate)
        return body


class PoolDescription(msgspec.Struct, kw_only=True):
    """``pool describe`` as data: the pool, its policies, its queue and its holders, and the
    nodes that back it (empty for a pool of abstract units; each holder's ``placement`` says
    where it runs)."""

    pool: Pool
    policies: list[Policy]
    queue: list[Request]
    active: list[Request]
    nodes: list[Node] = []


def _pool_view(pool: Pool, nodes: list[Node] | None = None) -> list[RenderableType]:
    return [pool_header(pool, nodes or ()), Text(), pool_keys_table(pool)]


def _queue(api: Api, pool: str, limit: int) -> list[Request]:
    queued = list_requests(api, pool=pool, status="queued", limit=limit)
    return sorted(queued, key=lambda r: (r.queue_position or 0, r.created_at))


def _nodes(api: Api, pool: Pool) -> list[Node]:
    """The nodes of ``pool`` (none asked for when it has none)."""
    if not pool.nodes:
        return []
    return api.call("GET", "/v1/nodes", list[Node], params={"pool": pool.name})


def _active(api: Api, pool: str, limit: int) -> list[Request]:
    held = list_requests(api, pool=pool, status="allocated", limit=limit)
    held += list_requests(api, pool=pool, status="preempting", limit=limit)
    return sorted(held, key=lambda r: r.allocated_at or r.created_at, reverse=True)


@app.command("create")
def create(name: NewPoolName, *, fields: PoolFields, shown: Shown) -> None:
    """Create a pool of capacity.

    A pool meant for nodes is created without --capacity: its capacity is the sum of its
    nodes' (`respool node add NAME --pool POOL ...`). A budget that refills, such as an LLM
    provider's tokens per minute, is a rate key (--rate; docs/rates.md).

    Example:

        respool pool create training-gpus -c '{"gpu": 8, "step_run": 32}' -d "Shared GPUs"
        respool pool create gpu-boxes --placement spread
        respool pool create llm --rate llm_tokens=2000000/60s --rate llm_requests=500/60s
    """
    body = {"name": name, "capacity": fields.capacity or {}} | fields.body()
    with shown.api() as api:
        pool = api.call("POST", "/v1/pools", Pool, body=body)
    note(f"created pool {pool.name} ({pool.id})")
    emit(pool, shown.output, lambda: _pool_view(pool))


@app.command("list")
def list_(*, shown: Shown) -> None:
    """List pools: used vs total per key, nodes and the number of queued requests.

    Example:

        respool pool list
        respool pool list -o json | jq '.[].name'
    """
    with shown.api() as api:
        pools = api.call("GET", "/v1/pools", list[Pool])
    emit(pools, shown.output, lambda: [pools_table(pools)])


@app.command("describe")
def describe(ref: PoolRef, limit: Limit = 100, *, shown: Shown) -> None:
    """Show a pool: capacity and usage, its policies, its queue and what holds its units;
    for a pool with nodes, its nodes and the requests running on each.

    Example:

        respool pool describe training-gpus
        respool pool describe 3f2a -o yaml
    """
    with shown.api() as api:
        pool = api.call("GET", f"/v1/pools/{segment(ref)}", Pool)
        data = PoolDescription(
            pool=pool,
            policies=api.call("GET", "/v1/policies", list[Policy], params={"pool": str(pool.id)}),
            queue=_queue(api, str(pool.id), limit),
            active=_active(api, str(pool.id), limit),
            nodes=_nodes(api, pool),
        )

    def table() -> Iterable[RenderableType]:
        yield from _pool_view(pool, data.nodes)
        yield Text()
        yield policies_table(data.policies, title="Policies", show_pool=False)
        if data.nodes:
            yield Text()
            yield nodes_table(data.nodes, show_pool=False, title=f"Nodes ({len(data.nodes)})")
        for title, found, view in (
            ("Queue", data.queue, "queued"),
            ("Holding", data.active, "active"),
        ):
            yield Text()
            if not found:
                yield Text(f"{title}: none", style="bold")
            elif view == "active" and data.nodes:
                yield placed_table(found, title=f"Running on its nodes ({len(found)})")
            else:
                yield requests_table(found, view=view, title=f"{title} ({len(found)})")

    emit(data, shown.output, table)


@app.command("update")
def update(ref: PoolRef, *, fields: PoolFields, shown: Shown) -> None:
    """Update a pool. Capacity merges: keys given are replaced or added, 0 removes a key;
    --rate KEY=AMOUNT/WINDOW sets a rate key, KEY=off removes it.

    Shrinking below what is allocated makes the reconciler preempt preemptible work.

    Example:

        respool pool update training-gpus -c '{"gpu": 4}'
        respool pool update training-gpus -c '{step_run: 0}' --queueing strict
        respool pool update training-gpus --starvation-seconds 600 --ordering fair
        respool pool update notebooks --slice-overuse terminate
        respool pool update llm --rate llm_tokens=3000000/1m
    """
    body = ({} if fields.capacity is None else {"capacity": fields.capacity}) | fields.body()
    if not body:
        raise typer.BadParameter(
            "nothing to update: give --capacity, --description, --queueing, --grace,"
            " --starvation-seconds, --ordering, --placement, --slice-overuse or --rate"
        )
    with shown.api() as api:
        pool = api.call("PATCH", f"/v1/pools/{segment(ref)}", Pool, body=body)
    note(f"updated pool {pool.name}")
    emit(pool, shown.output, lambda: _pool_view(pool))


@app.command("delete")
def delete(ref: PoolRef, yes: Yes = False, force: Force = False, *, remote: Remote) -> None:
    """Delete a pool and its policies (asks first unless --yes).

    Refused while requests are queued or allocated in it, unless --force cancels them.

    Example:

        respool pool delete training-gpus --yes
    """
    with remote.api() as api:
        pool = api.call("GET", f"/v1/pools/{segment(ref)}", Pool)
        confirm(f"Delete pool {pool.name} ({pool.id}) and its policies?", yes=yes)
        api.call("DELETE", f"/v1/pools/{pool.id}", params={"force": str(force).lower()})
    note(f"deleted pool {pool.name}")


@app.command("requests")
def requests(
    pool: PoolRef,
    view: ViewOpt = View.queued,
    limit: Limit = 100,
    every: Watch = None,
    *,
    shown: Shown,
) -> None:
    """List a pool's requests: its queue, what holds units, or everything.

    Example:

        respool pool requests training-gpus
        respool pool requests training-gpus --view active -o json
    """

    def draw() -> None:
        with shown.api() as api:
            ref = str(api.call("GET", f"/v1/pools/{segment(pool)}", Pool).id)
            if view is View.queued:
                found = _queue(api, ref, limit)
            elif view is View.active:
                found = _active(api, ref, limit)
            else:
                found = list_requests(api, pool=ref, limit=limit)
        emit(found, shown.output, lambda: [requests_table(found, view=view.value)])

    watch(every, shown.output, draw)
