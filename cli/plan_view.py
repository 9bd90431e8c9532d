"""The human view of an apply plan: changes with field diffs, then what the engine did."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from respool_client.manifest import Change, Plan
from rich.console import RenderableType
from rich.text import Text

from cli.fit import FitTable
from cli.tables import short, table
from cli.windows import fmt_window, fmt_windows

__all__ = ["plan_lines", "plan_summary"]

_SIGN = {"create": ("+", "green"), "update": ("~", "yellow"), "delete": ("-", "red")}


def _value(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | list | dict):
        return json.dumps(value)
    return str(value)


def _windows_change(old: Any, new: Any, action: str) -> str:
    """A windows change in the ``--window`` syntax: on an update the windows added (+) and
    removed (-); ``always`` for none (always in force)."""
    if action == "create" or old is None or new is None:
        was = "" if action == "create" else f"{fmt_windows(old)} → "
        return was + fmt_windows(new)
    before, after = [fmt_window(w) for w in old], [fmt_window(w) for w in new]
    return ", ".join(
        [f"+{w}" for w in after if w not in before] + [f"-{w}" for w in before if w not in after]
    )


def plan_summary(plan: Plan) -> str:
    if not plan.changes:
        return "No changes: the pools, policies and nodes match the file."
    n = {a: sum(1 for c in plan.changes if c.action == a) for a in _SIGN}
    if plan.dry_run:
        return f"Plan: {n['create']} to create, {n['update']} to update, {n['delete']} to delete."
    return f"Applied: {n['create']} created, {n['update']} updated, {n['delete']} deleted."


def _change(c: Change) -> Text:
    sign, style = _SIGN[c.action]
    text = Text(f"{sign} {c.kind} {c.label}", style=f"bold {style}")
    if c.kind == "node" and c.pool and not any(f.field == "pool" for f in c.fields):
        text.append(f" (pool {c.pool})", style=style)
    for f in c.fields:
        if f.field == "windows":
            text.append(f"\n      windows: {_windows_change(f.old, f.new, c.action)}")
        elif c.action == "create":
            text.append(f"\n      {f.field}: {_value(f.new)}")
        else:
            text.append(f"\n      {f.field}: {_value(f.old)} → {_value(f.new)}")
    return text


def _consequences(plan: Plan) -> FitTable:
    when = "would be" if plan.dry_run else "were"
    title = f"Requests that {when} affected (computed by the engine" + (
        ", then rolled back)" if plan.dry_run else ")"
    )
    out = table("REQUEST", "SUBJECT", "POOL", "CHANGE", "REASON", "MESSAGE", title=title)
    for c in plan.consequences:
        out.add_row(
            short(c.request_id),
            c.subject,
            c.pool or "-",
            " → ".join(c.path),
            c.reason or "-",
            c.message,
        )
    return out


def _overcommitted(plan: Plan) -> Text:
    text = Text("Usage above a ceiling, left for the reconciler to preempt:", style="bold")
    for o in plan.overcommitted:
        who = o.pool if o.subject is None else f"{o.pool}/{o.subject}"
        text.append(f"\n  {who} {o.key}: {o.used} used > {o.kind} {o.ceiling}")
    return text


def plan_lines(plan: Plan) -> Iterator[RenderableType]:
    yield Text(plan_summary(plan), style="bold")
    for c in plan.changes:
        yield _change(c)
    if plan.consequences:
        yield Text()
        yield _consequences(plan)
    elif plan.changes:
        yield Text("No queued or allocated request is affected.")
    if plan.overcommitted:
        yield _overcommitted(plan)
