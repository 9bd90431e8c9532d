"""Apply a manifest (:mod:`respool_client.manifest`) in one transaction, with the engine's
consequences.

:func:`apply_manifest` locks the pools involved, computes the changes, runs them through the
engine's own functions (``respool.create_pool``, ``update_policy``, ``create_node``...), lets
the reconciler's pass act on every touched pool when ``respool.reconcile_pool`` exists, and
reads back what the engine did to requests: the events written inside the transaction (grants,
rejections, preemptions, cancellations) and any usage still above a capacity or limit. A dry
run then rolls everything back, so the plan is what the engine would really do, and nothing
changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from uuid import UUID

import asyncpg
import msgspec
from msgspec import UNSET
from respool_client.manifest import (
    Change,
    Consequence,
    FieldChange,
    Manifest,
    Overcommit,
    Plan,
    PolicySpec,
    current_manifest,
    windows_key,
)

from app.db import nodes, policies, pools, reconcile
from app.db.errors import EngineError
from app.db.named import query
from app.manifest import (
    changed,
    merge_map,
    new_text,
    new_value,
    node_patch,
    plan_changes,
    rate_changes,
)

__all__ = ["apply_manifest"]


class _Runner:
    """Runs the changes in an order the engine accepts: deletions and lowered reservations
    first (they free reserved shares), then pools, then nodes (a node joins a pool that
    exists, after a pool update that cleared a hand-set capacity), then pool deletions (after
    their nodes moved away), then policy updates and creations (a reservation fits the
    capacity the nodes brought)."""

    def __init__(
        self, conn: asyncpg.Connection, manifest: Manifest, policy_ids: dict[str, UUID], force: bool
    ) -> None:
        self.conn = conn
        self.specs = {p.name: p for p in manifest.pools}
        self.node_specs = {n.name: n for n in manifest.nodes or []}
        self.policy_ids = policy_ids
        self.force = force

    async def run(self, changes: list[Change]) -> None:
        steps: tuple[tuple[str, str, Callable[[Change], Awaitable[None]]], ...] = (
            ("delete", "policy", self._delete_policy),
            ("update", "policy", self._lower_reserved),
            ("delete", "node", self._delete_node),
            ("create", "pool", self._create_pool),
            ("update", "pool", self._update_pool),
            ("update", "node", self._update_node),
            ("create", "node", self._create_node),
            ("delete", "pool", self._delete_pool),
            ("update", "policy", self._update_policy),
            ("create", "policy", self._create_policy),
        )
        for action, kind, op in steps:
            for change in changes:
                if (change.action, change.kind) == (action, kind):
                    await self._do(change, op)

    async def _do(self, change: Change, op: Callable[[Change], Awaitable[None]]) -> None:
        try:
            await op(change)
        except EngineError as exc:
            raise type(exc)(f"{change.kind} {change.label}: {exc.message}", exc.field) from exc

    def _policy(self, c: Change) -> str:
        return str(self.policy_ids[c.label])

    async def _delete_policy(self, c: Change) -> None:
        await policies.delete_policy(self.conn, self._policy(c), force=self.force)

    async def _lower_reserved(self, c: Change) -> None:
        lowered = merge_map(c.fields, "reserved", only="lowered")
        if lowered:
            await policies.update_policy(self.conn, self._policy(c), reserved=lowered)

    async def _delete_pool(self, c: Change) -> None:
        await pools.delete_pool(self.conn, c.pool, force=self.force)

    async def _create_pool(self, c: Change) -> None:
        fields = msgspec.structs.asdict(self.specs[c.pool])
        del fields["policies"]  # created as changes of their own
        await pools.create_pool(self.conn, **fields)

    async def _update_pool(self, c: Change) -> None:
        capacity = merge_map(c.fields, "capacity")
        grace = new_value(c.fields, "preemption_grace_seconds")
        starvation = new_value(c.fields, "starvation_seconds")
        await pools.update_pool(
            self.conn,
            c.pool,
            capacity=capacity or None,
            description=new_text(c.fields, "description"),
            queueing=new_text(c.fields, "queueing"),
            preemption_grace_seconds=grace if isinstance(grace, int) else None,
            starvation_seconds=starvation if isinstance(starvation, int) else None,
            starvation_off=changed(c.fields, "starvation_seconds") and starvation is None,
            ordering=new_text(c.fields, "ordering"),
            placement=new_text(c.fields, "placement"),
            slice_overuse=new_text(c.fields, "slice_overuse"),
            rates=rate_changes(c.fields) or None,
        )

    def _node(self, c: Change) -> str:
        assert c.node is not None  # a node's change names it
        return c.node

    async def _delete_node(self, c: Change) -> None:
        await nodes.delete_node(self.conn, self._node(c), force=self.force)

    async def _update_node(self, c: Change) -> None:
        await nodes.update_node(self.conn, self._node(c), node_patch(c.fields), force=self.force)

    async def _create_node(self, c: Change) -> None:
        await nodes.create_node(self.conn, msgspec.to_builtins(self.node_specs[self._node(c)]))

    async def _update_policy(self, c: Change) -> None:
        reserved = merge_map(c.fields, "reserved", only="raised")
        limit = merge_map(c.fields, "limit")
        priority = new_value(c.fields, "priority")
        description = new_text(c.fields, "description")
        lane = new_value(c.fields, "priority_lane")
        windows = new_value(c.fields, "windows") if changed(c.fields, "windows") else UNSET
        if not (
            reserved
            or limit
            or priority is not None
            or description is not None
            or lane is not None
            or windows is not UNSET
        ):
            return  # only lowered reservations, already applied
        await policies.update_policy(
            self.conn,
            self._policy(c),
            priority=priority if isinstance(priority, int) else None,
            reserved=reserved or None,
            limit=limit or None,
            description=description,
            priority_lane=lane if isinstance(lane, bool) else None,
            windows=windows if windows is UNSET or isinstance(windows, list) else None,
        )

    async def _create_policy(self, c: Change) -> None:
        spec = next(p for p in self.specs[c.pool].policies if p.subject == c.subject)
        await policies.create_policy(self.conn, pool=c.pool, **msgspec.structs.asdict(spec))


def _shape_fields(old: PolicySpec, new: PolicySpec) -> list[FieldChange]:
    """A policy's lane and windows changes (``windows`` as JSON, None: always in force); windows
    that mean the same (another order, days left out for every day) do not change."""
    fields = []
    if old.priority_lane != new.priority_lane:
        fields.append(FieldChange("priority_lane", old.priority_lane, new.priority_lane))
    if windows_key(old.windows) != windows_key(new.windows):
        fields.append(
            FieldChange(
                "windows", msgspec.to_builtins(old.windows), msgspec.to_builtins(new.windows)
            )
        )
    return fields


def _with_shapes(changes: list[Change], current: Manifest, desired: Manifest) -> list[Change]:
    """``changes`` with each policy's lane and windows changes (docs/preemption.md): added to
    its create or update, or as an update of its own after its pool's other changes."""
    have = {(p.name, s.subject): s for p in current.pools for s in p.policies}
    order = {p.name: i for i, p in enumerate(desired.pools)}
    out = list(changes)
    for pool in desired.pools:
        for spec in pool.policies:
            old = have.get((pool.name, spec.subject), PolicySpec(subject=spec.subject))
            fields = _shape_fields(old, spec)
            if not fields:
                continue
            at = next(
                (
                    i
                    for i, c in enumerate(out)
                    if c.kind == "policy" and (c.pool, c.subject) == (pool.name, spec.subject)
                ),
                None,
            )
            if at is not None:
                out[at] = msgspec.structs.replace(out[at], fields=[*out[at].fields, *fields])
                continue
            after = [i for i, c in enumerate(out) if c.kind != "node" and c.pool == pool.name]
            later = (
                i
                for i, c in enumerate(out)
                if c.kind == "node" or order.get(c.pool, len(order)) > order[pool.name]
            )
            at = after[-1] + 1 if after else next(later, len(out))
            update = Change(
                action="update", kind="policy", pool=pool.name, subject=spec.subject, fields=fields
            )
            out.insert(at, update)
    return out


async def _consequences(
    conn: asyncpg.Connection, after_event: int, pool_ids: list[UUID]
) -> list[Consequence]:
    by_request: dict[UUID, list[asyncpg.Record]] = {}
    for row in await conn.fetch(query("apply_events"), after_event, pool_ids):
        by_request.setdefault(row["request_id"], []).append(row)
    out = []
    for rid, rows in by_request.items():
        first, last = rows[0], rows[-1]
        reason = next((r["reason"] for r in reversed(rows) if r["reason"]), None)
        out.append(
            Consequence(
                request_id=rid,
                subject=last["subject"],
                pool=last["pool"],
                from_status=first["from_status"],
                to_status=last["to_status"],
                path=[first["from_status"] or "new", *(r["to_status"] for r in rows)],
                reason=reason,
                message=last["message"],
            )
        )
    return out


async def _overcommitted(conn: asyncpg.Connection, pool_names: list[str]) -> list[Overcommit]:
    rows = await conn.fetch(query("apply_overcommitted"), pool_names)
    return [msgspec.convert(dict(r), Overcommit) for r in rows]


async def _reconcile(conn: asyncpg.Connection, pool_names: list[str]) -> None:
    """Run the reconciler's pass (expiry, shrink and limit enforcement, reclaim) on each pool."""
    for row in await conn.fetch(query("pool_ids_by_name"), pool_names):
        await reconcile.reconcile_pool(conn, row["id"])  # this transaction holds the pool


async def _lock(conn: asyncpg.Connection, manifest: Manifest, prune: bool) -> list[UUID]:
    """Lock (in id order) every existing pool the apply may touch: those it names, the pools
    its nodes join and the pools they are in now (all of them with ``prune``); returns their
    ids."""
    nodes = manifest.nodes or []
    names = [p.name for p in manifest.pools] + [n.pool for n in nodes if n.pool]
    node_names = [n.name for n in nodes]
    rows = await conn.fetch(query("apply_pools_to_lock"), names, prune, node_names)
    ids = [r["id"] for r in rows]
    await conn.execute(query("lock_pools"), ids)
    return ids


def _touched(changes: list[Change]) -> list[str]:
    """The pools that remain after the changes and that a change touched: a node's old and
    new pool included."""
    deleted = {c.pool for c in changes if c.kind == "pool" and c.action == "delete"}
    names = {c.pool for c in changes}
    for c in changes:
        if c.kind == "node":
            names |= {str(f.old) for f in c.fields if f.field == "pool" and f.old}
    return sorted(names - deleted - {""})


async def apply_manifest(
    conn: asyncpg.Connection,
    manifest: Manifest,
    *,
    prune: bool = False,
    dry_run: bool = False,
    force: bool = False,
) -> Plan:
    """Make the pools, policies and nodes match ``manifest`` in one transaction (rolled back
    when ``dry_run``). ``prune`` deletes pools, policies and (when the manifest has ``nodes``)
    nodes the manifest does not name; ``force`` lets those deletions cancel live requests, and
    a node's deletion or move preempt what it holds (else the engine refuses with 409)."""
    tx = conn.transaction()
    await tx.start()
    try:
        locked = await _lock(conn, manifest, prune)
        after_event = int(await conn.fetchval(query("last_event_id")))
        have_pools = await pools.list_pools(conn)
        have_policies = await policies.list_policies(conn)
        have_nodes = await nodes.list_nodes(conn) if manifest.nodes is not None else []
        current = current_manifest(have_pools, have_policies, have_nodes)
        changes = _with_shapes(plan_changes(current, manifest, prune=prune), current, manifest)
        ids = {f"{p.pool}/{p.subject}": p.id for p in have_policies}
        await _Runner(conn, manifest, ids, force).run(changes)
        touched = _touched(changes)
        if changes:
            await _reconcile(conn, touched)
        plan = Plan(
            dry_run=dry_run,
            applied=not dry_run and bool(changes),
            changes=changes,
            consequences=await _consequences(conn, after_event, locked),
            overcommitted=await _overcommitted(conn, touched),
        )
    except BaseException:
        await tx.rollback()
        raise
    if dry_run:
        await tx.rollback()
    else:
        await tx.commit()
    return plan
