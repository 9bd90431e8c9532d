"""Human views (rich) of pools, policies, requests and events."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

from respool_client.durations import format_duration
from respool_client.wire import Eta, Event, Node, NodeAllocation, Placement, Policy, Pool, Request
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from cli.fit import Col, FitTable
from cli.windows import fmt_windows

__all__ = [
    "events_table",
    "fields",
    "fmt_eta",
    "fmt_devices",
    "fmt_iso",
    "fmt_map",
    "fmt_resources",
    "fmt_time",
    "node_allocations_table",
    "node_devices_table",
    "node_header",
    "node_keys_table",
    "nodes_table",
    "placed_table",
    "policies_table",
    "pool_header",
    "pool_keys_table",
    "pools_table",
    "request_header",
    "requests_table",
    "short",
    "table",
    "usage_bar",
]

BAR_WIDTH = 10
SOFT_KEYS = frozenset({"mcpu", "memory_mb", "step_run"})


def short(value: object) -> str:
    """The first 8 characters of an id: what tables show; commands take such a prefix."""
    return str(value)[:8]


def fmt_map(values: Mapping[str, int]) -> str:
    """``{"gpu": 4, "step_run": 2}`` → ``gpu=4 step_run=2``; zeros left out; empty → ``-``."""
    return " ".join(f"{k}={v}" for k, v in sorted(values.items()) if v) or "-"


def fmt_resources(values: Mapping[str, int]) -> str:
    """A request's resources in a table: as :func:`fmt_map`, without the ``step_run=1`` every
    request carries (the server adds it) unless it is all there is."""
    shown = {k: v for k, v in values.items() if not (k == "step_run" and v == 1)}
    return fmt_map(shown) if any(shown.values()) else fmt_map(values)


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _span(start: datetime | None, end: datetime | None) -> str:
    """``end - start`` as ``4m12s`` (never negative); ``-`` when either is unknown."""
    if start is None or end is None:
        return "-"
    seconds = max(0, int((end - start).total_seconds()))
    return format_duration(seconds) if seconds else "0s"


def _age(since: datetime | None) -> str:
    return _span(since, datetime.now(UTC))


def _left(until: datetime | None) -> str:
    return _span(datetime.now(UTC), until)


def usage_bar(used: int, total: int | None, width: int = BAR_WIDTH) -> Text:
    """``██████░░░░ 6/8``, green under 70 %, yellow under 90 %, red above; ``3 (untracked)``
    for a soft key the pool does not track."""
    if total is None:
        return Text(f"{used} (untracked)", style="dim")
    ratio = used / total if total else 1.0
    filled = min(width, round(ratio * width))
    style = "green" if ratio < 0.7 else "yellow" if ratio < 0.9 else "red"
    bar = Text("█" * filled, style=style)
    bar.append("░" * (width - filled), style="dim")
    bar.append(f" {used}/{total}")
    if used > total:
        bar.append(" over", style="bold red")
    return bar


def _pool_keys(pool: Pool) -> list[tuple[str, int, int | None]]:
    """(key, used, capacity or None when untracked) for every key with capacity or usage; a
    rate key (docs/rates.md) last, labelled with its window (``llm_tokens/60s``), its used the
    charges inside the window and its total the amount."""
    keys = sorted((set(pool.capacity) | set(pool.usage)) - set(pool.rates))
    rows = [(k, pool.usage.get(k, 0), pool.capacity.get(k)) for k in keys]
    return rows + [
        (rate_label(k, r.per_seconds), r.used, r.amount) for k, r in sorted(pool.rates.items())
    ]


def rate_label(key: str, per_seconds: int) -> str:
    """A rate key with its window, as the tables show it: ``llm_tokens/1m``."""
    return f"{key}/{format_duration(per_seconds)}"


def _usage_cell(pool: Pool, key_width: int = 0) -> RenderableType:
    """A pool's keys with their usage bars; ``key_width``: the widest key of every pool in the
    table, so that the bars of all pools line up. A rate key reads USED/AMOUNT per window."""
    rows = _pool_keys(pool)
    if not rows:
        return Text("-", style="dim")
    keys = Column(no_wrap=True, min_width=key_width)
    grid = Table.grid(keys, Column(no_wrap=True), padding=(0, 1))
    for key, used, total in rows:
        grid.add_row(Text(key), usage_bar(used, total))
    return grid


# Free-text columns are cut (with an ellipsis) first when a table is too wide.
_TEXT = frozenset(
    {"DESCRIPTION", "MESSAGE", "WAITING FOR", "REASON", "SUBJECT", "RESOURCES", "LABELS"}
)


class Listing(FitTable):
    """A table that, without rows, is one line instead of a lone header: ``no pools`` (its
    ``empty``), or ``Policies: none`` under a title. Its ``whole`` columns (a policy's subject)
    are cut only when nothing else can go: low-value columns are left out first."""

    empty = ""
    whole: frozenset[str] = frozenset()

    def _keep_whole(self, table: Table) -> Table:
        for column in table.columns:
            if column.header in self.whole:
                column.max_width, column.no_wrap = None, True
        return table

    def layout(self, console: Console, width: int) -> Table:
        if self.wide or not self.whole:
            return super().layout(console, width)
        shown = list(self.cols)
        wide = console.options.update(max_width=10_000)
        droppable = sorted((c for c in self.cols if c[1].drop), key=lambda c: c[1].drop)
        for col in [*droppable, None]:
            narrow = self._keep_whole(self._build(shown, floor=True))
            if Measurement.get(console, wide, narrow).maximum <= width:
                return self._keep_whole(self._build(shown))
            if col is not None:
                shown.remove(col)
        return super().layout(console, width)  # too narrow even so: cut them too

    def _none(self) -> Text | None:
        if self.rows or not self.empty:
            return None
        return Text(f"{self.title}: none", style="bold") if self.title else Text(self.empty)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        none = self._none()
        if none is not None:
            yield none
        else:
            yield from super().__rich_console__(console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        none = self._none()
        if none is not None:
            return Measurement.get(console, options, none)
        return super().__rich_measure__(console, options)


def table(*headers: str | Col, title: str | None = None, empty: str = "") -> Listing:
    """A borderless table in the house style that fits the terminal (see :mod:`cli.fit`);
    a plain header is a column that may shrink when it holds free text. ``empty``: the line
    shown instead when it has no rows (``no pools``)."""
    cols = [Col(h, shrink=h in _TEXT) if isinstance(h, str) else h for h in headers]
    out = Listing(*cols, title=title)
    out.empty = empty
    return out


_BLANK = frozenset({"", "-", "0"})


def _plain(cell: RenderableType) -> str | None:
    return cell if isinstance(cell, str) else cell.plain if isinstance(cell, Text) else None


def drop_blank(out: FitTable, *headers: str, blank: frozenset[str] = _BLANK) -> None:
    """Leave out those of ``headers`` whose every cell is empty, ``-`` or ``0`` (or in
    ``blank``): they say nothing and take the room of the subjects and windows. ``-o wide``
    keeps every column."""
    if out.wide or not out.rows:
        return
    out.cols = [
        (i, col)
        for i, col in out.cols
        if col.header not in headers or any(_plain(row[i]) not in blank for row in out.rows)
    ]


def pools_table(pools: Sequence[Pool]) -> FitTable:
    """NODES: how many nodes back a pool; ``-`` for a pool of abstract units (``0`` for one
    waiting for its first node). The usage bars of all pools line up."""
    key_width = max((len(k) for p in pools for k, _, _ in _pool_keys(p)), default=0)
    out = table(
        "NAME",
        Col("ID", drop=2),
        "USED / TOTAL",
        Col("NODES", drop=3),
        "QUEUED",
        Col("QUEUEING", drop=1),
        Col("DESCRIPTION", shrink=True, drop=4),
        empty="no pools",
    )
    for p in pools:
        out.add_row(
            p.name,
            short(p.id),
            _usage_cell(p, key_width),
            str(p.nodes) if p.nodes or _awaits_nodes(p) else "-",
            str(p.queued),
            p.queueing,
            p.description or "",
        )
    drop_blank(out, "NODES", "DESCRIPTION", blank=frozenset({"", "-"}))
    return out


def _awaits_nodes(pool: Pool) -> bool:
    """A pool created without capacity is meant for nodes: it has none until a node joins."""
    return not pool.nodes and not pool.capacity and not any(pool.usage.values())


# --- nodes (docs/cli.md, "Nodes") ---------------------------------------------------------------


def _key_order(keys: Iterable[str]) -> list[str]:
    """Device-like keys first (gpu, then the custom ones), then the soft keys, each by name."""
    return sorted(set(keys), key=lambda k: (k in SOFT_KEYS, k != "gpu", k))


def _node_keys(node: Node) -> list[str]:
    return _key_order(set(node.capacity) | {k for k, v in node.usage.items() if v})


def _used_of(node: Node, key: str) -> str:
    """``2/8`` on a node that tracks ``key``; ``-`` when it does not."""
    if key not in node.capacity:
        used = node.usage.get(key, 0)
        return f"{used} (untracked)" if used else "-"
    return f"{node.usage.get(key, 0)}/{node.capacity[key]}"


def _state_text(state: str) -> Text:
    return Text(state, style={"active": "green", "cordoned": "yellow"}.get(state, "red"))


def nodes_table(
    nodes: Sequence[Node], *, show_pool: bool = True, title: str | None = None
) -> FitTable:
    """NAME POOL STATE, one USED/TOTAL column per key any node has, LABELS."""
    keys = _key_order(k for n in nodes for k in _node_keys(n))
    headers: list[str | Col] = ["NAME", Col("POOL", drop=2), "STATE", *(k.upper() for k in keys)]
    headers.append(Col("LABELS", shrink=True, drop=1))
    if not show_pool:
        del headers[1]
    out = table(*headers, title=title, empty="no nodes")
    for n in nodes:
        cells: list[RenderableType] = [n.name, n.pool or "-", _state_text(n.state)]
        if not show_pool:
            del cells[1]
        cells += [_used_of(n, k) for k in keys]
        cells.append(fmt_labels(n.labels))
        out.add_row(*cells)
    return out


def node_header(node: Node) -> Table:
    return fields(
        [
            ("Node", node.name),
            ("ID", node.id),
            ("Pool", node.pool or "- (in no pool)"),
            ("State", _state_text(node.state)),
            ("Labels", fmt_labels(node.labels)),
            ("Created", fmt_time(node.created_at)),
            ("Updated", fmt_time(node.updated_at)),
        ]
    )


def node_keys_table(node: Node) -> FitTable:
    out = table("KEY", "CAPACITY", "USED", "FREE", "USAGE", "DEVICES", title="Capacity")
    for key in _node_keys(node):
        used, total = node.usage.get(key, 0), node.capacity.get(key)
        out.add_row(
            key,
            "untracked" if total is None else str(total),
            str(used),
            "-" if total is None else str(total - used),
            usage_bar(used, total),
            _devices_of(node, key),
        )
    return out


def _devices_of(node: Node, key: str) -> str:
    """How many devices back ``key``; ``of gpu`` for the memory and share derived from a shared
    key's devices; else ``anonymous``."""
    if key in node.devices:
        return str(len(node.devices[key]))
    for shared in node.sharing:
        if key in (f"{shared}_memory_mb", f"{shared}_share"):
            return f"of {shared}"
    return "anonymous"


def _holder(a: NodeAllocation) -> tuple[str, str]:
    """Its short id and subject; ``(hidden)`` where a client token may not read them."""
    if a.request_id is None or a.subject is None:
        return "(hidden)", "(hidden)"
    return short(a.request_id), a.subject


def _fmt_slice(memory_mb: int, share: int | None) -> str:
    """``20480 MiB`` or ``20480 MiB, 50%``."""
    return f"{memory_mb} MiB" + ("" if share is None else f", {share}%")


def node_devices_table(node: Node) -> FitTable:
    """Every named device in list order, and who holds it (``-``: free). A node with shared
    devices adds SLICE (a holder's memory and compute share; ``whole`` for a whole-device
    holder) and FREE (the device's memory left for slices, with its isolation): one row per
    slice holder of a shared device."""
    holders: dict[tuple[str, str], list[tuple[tuple[str, str], str]]] = {}
    for a in node.allocations:
        for key, ids in a.devices.items():
            for device in ids:
                part = a.slices.get(key, {}).get(device)
                what = "whole" if part is None else _fmt_slice(part.memory_mb, part.share)
                holders.setdefault((key, device), []).append((_holder(a), what))
    shared = bool(node.sharing)
    headers = ["KEY", "DEVICE", "HOLDER", "SUBJECT"] + (["SLICE", "FREE"] if shared else [])
    out = table(*headers, title="Devices")
    for key in _key_order(node.devices):
        mode = node.sharing.get(key)
        offer = node.device_memory_mb.get(key, 0) - node.reserved_memory_mb.get(key, 0)
        for device in node.devices[key]:
            rows = holders.get((key, device), [])
            if not shared:
                holder, subject = rows[0][0] if rows else ("-", "-")
                out.add_row(key, device, holder, subject)
                continue
            free = "-"
            if mode is not None:
                held = sum(
                    p.memory_mb
                    for a in node.allocations
                    if (p := a.slices.get(key, {}).get(device)) is not None
                )
                whole = any(what == "whole" for _, what in rows)
                free = f"{0 if whole else offer - held}/{offer} MiB ({mode})"
            if not rows:
                out.add_row(key, device, "-", "-", "-", free)
            for i, ((holder, subject), what) in enumerate(rows):
                first = i == 0
                out.add_row(
                    key if first else "",
                    device if first else "",
                    holder,
                    subject,
                    what,
                    free if first else "",
                )
    return out


def fmt_devices(devices: Mapping[str, Sequence[str]]) -> str:
    """``{"gpu": ["2", "3"]}`` → ``gpu=2,3``; none → ``-``."""
    return " ".join(f"{k}={','.join(v)}" for k, v in sorted(devices.items()) if v) or "-"


def node_allocations_table(node: Node) -> FitTable:
    out = table("REQUEST", "SUBJECT", "STATUS", "RESOURCES", "DEVICES", title="Allocations")
    for a in node.allocations:
        out.add_row(*_holder(a), a.status, fmt_resources(a.resources), fmt_devices(a.devices))
    return out


def placed_table(requests: Sequence[Request], *, title: str | None = None) -> FitTable:
    """Requests with their node and devices (``pool describe`` of a pool with nodes)."""
    out = table(
        "NODE",
        "ID",
        "SUBJECT",
        "STATUS",
        "RESOURCES",
        Col("DEVICES", shrink=True),
        Col("HELD", drop=1),
        title=title,
        empty="no requests",
    )
    rows = sorted(requests, key=lambda r: (r.placement.node if r.placement else "", str(r.id)))
    for r in rows:
        out.add_row(
            r.placement.node if r.placement else "-",
            short(r.id),
            r.subject,
            r.status,
            fmt_resources(r.resources),
            fmt_devices(r.placement.devices) if r.placement else "-",
            _age(r.allocated_at),
        )
    return out


def fields(rows: Iterable[tuple[str, object]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="ellipsis")
    for name, value in rows:
        cell = value if isinstance(value, Text) else Text(str(value))
        cell.no_wrap, cell.overflow = True, "ellipsis"
        grid.add_row(name, cell)
    return grid


_NODE_STATES = ("active", "cordoned", "draining")


def _fmt_nodes(pool: Pool, nodes: Sequence[Node]) -> str:
    """``3 (2 active, 1 cordoned)``; ``none yet`` for a pool waiting for its first node;
    ``- (abstract units)`` for a pool of its own capacity."""
    if _awaits_nodes(pool):
        return f"none yet: its capacity is its nodes' (respool node add NAME --pool {pool.name})"
    if not pool.nodes:
        return "- (abstract units)"
    states = [(s, sum(n.state == s for n in nodes)) for s in _NODE_STATES]
    counts = ", ".join(f"{count} {state}" for state, count in states if count)
    return f"{pool.nodes} ({counts})" if counts else str(pool.nodes)


def pool_header(pool: Pool, nodes: Sequence[Node] = ()) -> Table:
    """The pool's fields; ``nodes``: its nodes, when known, for their count per state."""
    return fields(
        [
            ("Pool", pool.name),
            ("ID", pool.id),
            ("Description", pool.description or "-"),
            ("Queueing", pool.queueing),
            ("Preemption grace", f"{pool.preemption_grace_seconds}s"),
            (
                "Starvation guard",
                "off" if pool.starvation_seconds is None else f"{pool.starvation_seconds}s",
            ),
            ("Ordering", pool.ordering),
            ("Nodes", _fmt_nodes(pool, nodes)),
            ("Placement", pool.placement),
            ("Slice overuse", pool.slice_overuse),
            ("Queued", pool.queued),
            ("Created", fmt_time(pool.created_at)),
            ("Updated", fmt_time(pool.updated_at)),
        ]
    )


def pool_keys_table(pool: Pool) -> RenderableType:
    if _awaits_nodes(pool):
        return Text("Capacity: none yet (no nodes)", style="bold")
    out = table(
        "KEY", "CAPACITY", "USED", "FREE", "USAGE", Col("NEXT REFILL", drop=1), title="Capacity"
    )
    refills = {rate_label(k, r.per_seconds): r.next_refill_at for k, r in pool.rates.items()}
    for key, used, total in _pool_keys(pool):
        free = "-" if total is None else str(max(total - used, 0))
        cap = "untracked" if total is None else str(total)
        # a rate key: its amount per window, and when the oldest charge inside leaves it
        when = refills.get(key)
        refill = _left(when) if when else "-"
        out.add_row(key, cap, str(used), free, usage_bar(used, total), refill)
    drop_blank(out, "NEXT REFILL", blank=frozenset({"-"}))
    return out


def policies_table(
    policies: Sequence[Policy], *, title: str | None = None, show_pool: bool = True
) -> FitTable:
    """Policies with their shares, usage and shape: LANE, WINDOWS (the ``--window`` syntax),
    ACTIVE and NEXT CHANGE (UTC); COVERS (the subjects a pattern serves now) when any policy
    is a pattern (docs/preemption.md). Columns with nothing in them are left out (but for
    ``-o wide``), so that subjects and windows have the room."""
    patterns = any("*" in p.subject for p in policies)
    headers: list[str | Col] = [
        Col("SUBJECT", shrink=True),
        "PRIORITY",
        Col("RESERVED", shrink=True),
        Col("LIMIT", shrink=True, drop=5),
        Col("USED", shrink=True),
        Col("BORROWED", shrink=True, drop=3),
        Col("LANE", drop=4),
        Col("WINDOWS", shrink=True, drop=7),
        "ACTIVE",
        Col("NEXT CHANGE", drop=6),
        *([Col("COVERS", shrink=True, drop=2)] if patterns else []),
        Col("ID", drop=1),
    ]
    out = table(
        *([Col("POOL"), *headers] if show_pool else headers), title=title, empty="no policies"
    )
    out.whole = frozenset({"SUBJECT"})
    for p in policies:
        cells = [
            p.subject,
            str(p.priority),
            fmt_map(p.reserved),
            fmt_map(p.limit),
            fmt_map(p.usage),
            fmt_map(p.borrowed),
            _yes(p.priority_lane),
            fmt_windows(p.windows),
            _yes(p.active),
            fmt_iso(p.next_change),
        ]
        if patterns:
            cells.append(", ".join(p.covers) if "*" in p.subject and p.covers else "-")
        cells.append(short(p.id))
        out.add_row(*([p.pool, *cells] if show_pool else cells))
    blank = ("PRIORITY", "RESERVED", "LIMIT", "USED", "BORROWED", "NEXT CHANGE", "COVERS")
    drop_blank(out, *blank)
    drop_blank(out, "LANE", blank=frozenset({"no"}))
    return out


def fmt_iso(value: datetime | None) -> str:
    """An instant in UTC ISO form, ``2026-03-30T07:00:00Z``; ``-`` for none."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A column of a requests table: its header and how a request fills its cell.
_RequestColumn = tuple[str | Col, Callable[[Request], RenderableType]]
_ID: _RequestColumn = ("ID", lambda r: short(r.id))
_SUBJECT: _RequestColumn = ("SUBJECT", lambda r: r.subject)
_STATUS: _RequestColumn = ("STATUS", lambda r: r.status)
_RESOURCES: _RequestColumn = ("RESOURCES", lambda r: fmt_resources(r.resources))
_PREEMPTIBLE: _RequestColumn = (Col("PREEMPTIBLE", drop=1), lambda r: _yes(r.preemptible))
_LABELS: _RequestColumn = (Col("LABELS", shrink=True, wide=True), lambda r: fmt_labels(r.labels))
_REQUEST_VIEWS: dict[str, tuple[_RequestColumn, ...]] = {
    "queued": (
        ("POS", lambda r: str(r.queue_position or "-")),
        _ID,
        _SUBJECT,
        _RESOURCES,
        _PREEMPTIBLE,
        (Col("WAITING", drop=2), lambda r: _age(r.created_at)),
        ("WAITING FOR", lambda r: r.message),
        _LABELS,
    ),
    "active": (
        _ID,
        _SUBJECT,
        _STATUS,
        _RESOURCES,
        _PREEMPTIBLE,
        (Col("HELD", drop=3), lambda r: _age(r.allocated_at)),
        (Col("LEASE LEFT", drop=2), lambda r: _left(r.lease_expires_at)),
        _LABELS,
    ),
    "all": (
        _ID,
        _SUBJECT,
        (Col("POOL", drop=2), lambda r: r.pool or "-"),
        (Col("NODE", drop=3), lambda r: _node_name(r)),
        _STATUS,
        ("REASON", lambda r: request_reason(r)),
        _RESOURCES,
        (Col("AGE", drop=1), lambda r: _age(r.created_at)),
        _LABELS,
    ),
}


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _node_name(r: Request) -> str:
    """Where it runs, else where it ran last; ``-`` for neither."""
    where = r.placement or r.last_placement
    return where.node if where else "-"


def requests_table(
    requests: Sequence[Request],
    *,
    view: str = "all",
    title: str | None = None,
    empty: str = "no requests",
) -> FitTable:
    """``view``: ``queued`` (position and what it waits for), ``active`` (holders) or ``all``;
    ``empty``: the line shown when there is none."""
    columns = _REQUEST_VIEWS.get(view, _REQUEST_VIEWS["all"])
    out = table(*(header for header, _ in columns), title=title, empty=empty)
    for r in requests:
        out.add_row(*(cell(r) for _, cell in columns))
    return out


def request_reason(r: Request) -> str:
    """REASON: why a queued request waits (its message, as squeue shows it), else the code
    of its last change; ``-`` for none."""
    if r.status == "queued" and r.message:
        return r.message
    return r.reason or "-"


def request_header(r: Request) -> Group:
    rows: list[tuple[str, object]] = [
        ("Request", r.id),
        ("Subject", r.subject),
        ("Pool", r.pool or "-"),
        ("Status", Text(r.status, style=_status_style(r.status))),
        ("Reason", r.reason or "-"),
        ("Message", r.message or "-"),
        ("Resources", fmt_map(r.resources)),
        ("Preemptible", _yes(r.preemptible)),
        ("Priority", r.priority),
        ("Attempt", f"{r.attempt} (max retries {r.max_retries})"),
        ("Lease", f"{r.lease_seconds}s" if r.lease_seconds else "none"),
        ("Lease until", fmt_time(r.lease_expires_at)),
        ("Labels", fmt_labels(r.labels)),
        ("Created", fmt_time(r.created_at)),
        ("Allocated", fmt_time(r.allocated_at)),
        ("Finished", fmt_time(r.finished_at)),
    ]
    if r.max_seconds is not None:
        rows.insert(-3, ("Max runtime", f"{r.max_seconds}s (until {fmt_time(r.run_deadline)})"))
    if r.node_selector:
        rows.insert(-4, ("Node selector", fmt_labels(r.node_selector)))
    if r.preemption_group is not None:
        rows.insert(8, ("Preemption group", r.preemption_group))
    if r.placement is not None:
        where = f"node {r.placement.node}, devices {fmt_devices(r.placement.devices)}"
        rows.insert(-4, ("Placement", where))
    elif r.last_placement is not None:  # where it ran, once it no longer holds units
        was = r.last_placement
        rows.insert(-4, ("Ran on", f"node {was.node}, devices {fmt_devices(was.devices)}"))
    if r.queue_position is not None:
        rows.insert(4, ("Queue position", r.queue_position))
        rows.insert(5, ("ETA", fmt_eta(r.eta)))
    return Group(fields(rows))


def fmt_eta(eta: Eta | None) -> str:
    """A queued request's ETA, ``~2m (90%: within 5m)``, or why there is none (see
    docs/scheduling.md)."""
    if eta is None:
        return "unknown (fewer than 10 recorded holds in its pools)"
    return f"~{_secs(eta.p50_seconds)} (90%: within {_secs(eta.p90_seconds)})"


def _secs(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{round(seconds / 60)}m"
    return f"{seconds / 3600:.1f}h"


def fmt_labels(labels: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def _status_style(status: str) -> str:
    return {
        "allocated": "green",
        "queued": "yellow",
        "preempting": "yellow",
        "rejected": "red",
        "preempted": "red",
        "expired": "red",
    }.get(status, "")


def events_table(events: Sequence[Event]) -> FitTable:
    """PLACED ON (in a pool with nodes): the node and devices of each grant."""
    placed = any(e.placement is not None for e in events)
    cols: list[str | Col] = ["AT", "FROM", "TO", "REASON", Col("ATTEMPT", drop=1), "MESSAGE"]
    out = table(*cols, *([Col("PLACED ON", shrink=True)] if placed else []), empty="no events")
    for e in events:
        on = [] if not placed else [_placed_on(e.placement)]
        out.add_row(
            fmt_time(e.at),
            e.from_status or "-",
            e.to_status,
            e.reason or "-",
            str(e.attempt),
            _event_message(e),
            *on,
        )
    return out


def _placed_on(placement: Placement | None) -> str:
    if placement is None:
        return ""
    devices = fmt_devices(placement.devices)
    return f"{placement.node} {devices}" if placement.devices else placement.node


def _event_message(e: Event) -> str:
    """The message, and the request the change happened for when the token may read it."""
    if e.cause_request_id is None:
        return e.message or ""
    return f"{e.message} (request {short(e.cause_request_id)} of {e.cause_subject})"
