"""``request create --dry-run`` as a plan: what would happen to the request now, in words, and
the allocations the reconciler would preempt for it. Nothing of a created request (no id, no
creation time, no lease deadline): nothing is created."""

from __future__ import annotations

from respool_client.wire import Victim, WhatIf
from rich.console import RenderableType
from rich.text import Text

from cli.fit import FitTable
from cli.tables import fields, fmt_eta, fmt_labels, fmt_map, short, table

__all__ = ["outcome", "plan_view"]


def _preemptions(n: int) -> str:
    return f"{n} preemption" + ("" if n == 1 else "s")


def outcome(what: WhatIf, grace: int | None) -> str:
    """The outcome in words: ``would be allocated now in pool P``, ``would wait: #3 in queue
    in pool P (message)``, ``would be allocated after 2 preemptions (grace 5 s)``, ``would be
    rejected (reason): message``. ``grace``: the pool's preemption grace, when it preempts."""
    where = f" in pool {what.pool}" if what.pool else ""
    if what.status == "allocated":
        return f"would be allocated now{where}"
    if what.status == "rejected":
        reason = f" ({what.reason})" if what.reason else ""
        return f"would be rejected{reason}: {what.message}" if what.message else "would be rejected"
    if what.would_preempt:
        wait = "no grace period" if not grace else f"grace {grace} s"
        return f"would be allocated after {_preemptions(len(what.would_preempt))}{where} ({wait})"
    if what.status == "queued":
        place = f"#{what.queue_position} in queue" if what.queue_position else "queued"
        why = f": {what.message}" if what.message else ""
        return f"would wait: {place}{where}{why}"
    return f"would be {what.status}{where}"


def _victim(v: Victim) -> tuple[str, str]:
    if v.id is None:
        return "-", "(another subject's)"
    return short(v.id), v.subject or "-"


def victims_table(what: WhatIf) -> FitTable:
    out = table("REQUEST", "SUBJECT", "POOL", "RESOURCES", title="Would preempt")
    for v in what.would_preempt:
        request, subject = _victim(v)
        out.add_row(request, subject, v.pool or "-", fmt_map(v.resources))
    return out


def plan_view(what: WhatIf, grace: int | None) -> list[RenderableType]:
    """The plan: the outcome first, then the request as it would be asked, then the victims."""
    rows: list[tuple[str, object]] = [
        ("Outcome", Text(outcome(what, grace), style="bold")),
        ("Subject", what.subject),
        ("Pool", what.pool or "-"),
        ("Resources", fmt_map(what.resources)),
        ("Preemptible", "yes" if what.preemptible else "no"),
        ("Priority", what.priority),
        ("Lease", f"{what.lease_seconds}s" if what.lease_seconds else "none"),
    ]
    if what.status == "queued" and not what.would_preempt:
        rows.insert(1, ("ETA", fmt_eta(what.eta)))
    if what.max_seconds is not None:
        rows.append(("Max runtime", f"{what.max_seconds}s"))
    if what.node_selector:
        rows.append(("Node selector", fmt_labels(what.node_selector)))
    if what.preemption_group is not None:
        rows.append(("Preemption group", what.preemption_group))
    if what.labels:
        rows.append(("Labels", fmt_labels(what.labels)))
    if what.placement is not None:
        rows.append(("Node", what.placement.node))
    if not what.would_preempt:
        rows.append(("Would preempt", "nothing"))
    parts: list[RenderableType] = [Text("Dry run: nothing was created.", style="dim"), fields(rows)]
    if what.would_preempt:
        parts += [Text(), victims_table(what)]
    return parts
