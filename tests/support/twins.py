"""Known-bad engines ("broken twins"), built at test time from the real functions.

Each twin takes the installed function's source (``pg_get_functiondef``) and removes one guard
with a targeted text replacement; a replacement that no longer matches fails loudly, so a twin
can never drift from the engine it breaks. Install one only into a test's own database.

* ``broken_twin``: ``_blocker`` admits everything and ``_move_units`` (the pool's and the
  policy's counters in one statement) charges the counters without its guards (any missing
  counter row is created), so the invariant auditor must report I1/I2.
* ``broken_shrink_twin``: the two shrink-enforcement bugs fixed earlier — a removed custom
  key (capacity 0: not a soft key) is never enforced, and the minimal-victim routine
  (``_minimal_victims``, which shrink enforcement shares with preemption) takes every victim its
  walk meets, also after the excess is gone and one holding no key still over, and never drops
  the ones not needed (not a minimal set).
* ``broken_device_twin``: ``_place_on_node`` takes a node's devices by list position without
  looking at their holders (the ``holder_id IS NULL`` tests go), so a grant can take a device an
  allocation on that node already holds: two allocations placed on one device (the second
  overwrites the first's holder), which the node auditors must report (I6).
* ``broken_slice_twin``: a shared device held whole still offers its room to slices
  (``_device_places`` ignores the whole holder for a slice, ``_place_on_node``'s slice update
  drops its ``holder_id IS NULL`` guard) and the CHECK ``never_whole_and_sliced`` is dropped
  (:data:`TWIN_SCHEMA`), so a slice can land on a device held whole, which the auditor must
  report (I9).
* ``broken_group_twin``: the victim rule (``_may_preempt``, which both victim choices share)
  ignores preemption groups, so a request may preempt an allocation of its own group, which the
  policy-shapes model must report (tests/engine/test_model_shapes.py).
"""

from __future__ import annotations

import asyncpg

# twin -> [(function, [(text in its source, replacement)])]
TWINS: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {
    "broken_twin": [
        (
            "respool._blocker(jsonb, boolean, uuid, uuid)",
            [("WHERE msg IS NOT NULL", "WHERE false")],
        ),
        (
            "respool._move_units(uuid, uuid, jsonb, jsonb, integer, boolean)",
            [
                (
                    "\n           AND (NOT p_guard OR p_sign < 0"
                    " OR pr.used + x.value::bigint <= pr.capacity"
                    "\n                OR (pr.capacity IS NULL AND respool._is_soft_key(pr.key)"
                    "\n                    AND pr.used + x.value::bigint <= respool._max_total()))",
                    "",
                ),
                (
                    "IF p_sign < 0 OR (p_guard AND EXISTS",
                    "IF false AND (p_guard AND EXISTS",
                ),
                (
                    "\n           AND (p_sign < 0 OR pol.used + x.value::bigint"
                    ' <= coalesce(pol."limit", respool._max_total()))',
                    "",
                ),
            ],
        ),
    ],
    "broken_shrink_twin": [
        (
            "respool._excess(uuid, uuid)",
            [
                (
                    "AND u.bound IS NOT NULL",
                    "AND u.bound > 0",
                )
            ],
        ),
        (
            "respool._minimal_victims(uuid[], uuid[], jsonb[], jsonb, jsonb, uuid)",
            [
                ("CONTINUE WHEN NOT useful;", "NULL;"),
                ("EXIT WHEN NOT respool._any_over(deficit);", "NULL;"),
                ("IF NOT respool._holds_any(held[i],", "IF false AND respool._holds_any(held[i],"),
            ],
        ),
    ],
    "broken_device_twin": [
        (
            "respool._place_on_node(respool.requests, uuid)",
            [
                (
                    "WHERE d.node_id = p_node_id AND d.holder_id IS NULL AND v_units ? d.key",
                    "WHERE d.node_id = p_node_id AND v_units ? d.key",
                ),
                (
                    "AND t.device = w.device AND t.holder_id IS NULL;",
                    "AND t.device = w.device;",
                ),
            ],
        ),
    ],
    "broken_slice_twin": [
        (
            "respool._device_places(uuid, jsonb, boolean, uuid)",
            [
                (
                    "CASE WHEN d.holder_id IS NULL THEN respool._room(c.memory, d.memory_used)",
                    "CASE WHEN d.holder_id IS NULL OR w.slice"
                    " THEN respool._room(c.memory, d.memory_used)",
                ),
                (
                    "CASE WHEN d.holder_id IS NULL THEN respool._room(c.share, d.share_used)",
                    "CASE WHEN d.holder_id IS NULL OR w.slice"
                    " THEN respool._room(c.share, d.share_used)",
                ),
            ],
        ),
        (
            "respool._place_on_node(respool.requests, uuid)",
            [("AND d.device = v_device AND d.holder_id IS NULL", "AND d.device = v_device")],
        ),
    ],
    "broken_group_twin": [
        (
            "respool._may_preempt(text, uuid, boolean, bigint, boolean, text, uuid, bigint,"
            " boolean, text)",
            [("AND (p_group IS NULL OR v_group IS DISTINCT FROM p_group)", "")],
        ),
    ],
}


# twin -> schema statements run before its functions are replaced (guards that are constraints)
TWIN_SCHEMA: dict[str, list[str]] = {
    "broken_slice_twin": [
        "ALTER TABLE respool.node_devices DROP CONSTRAINT never_whole_and_sliced",
    ],
}


def _broken(source: str, function: str, replacements: list[tuple[str, str]]) -> str:
    """``source`` with each replacement applied exactly once (AssertionError when one misses)."""
    for old, new in replacements:
        count = source.count(old)
        assert count == 1, f"twin replacement matched {count} times in {function}: {old!r}"
        source = source.replace(old, new)
    return source


async def install_twin(conn: asyncpg.Connection, name: str) -> None:
    """Replace the engine functions that twin ``name`` breaks (see :data:`TWINS`), after its
    schema statements (:data:`TWIN_SCHEMA`)."""
    for statement in TWIN_SCHEMA.get(name, []):
        await conn.execute(statement)
    for function, replacements in TWINS[name]:
        source = await conn.fetchval("SELECT pg_get_functiondef($1::regprocedure)", function)
        await conn.execute(_broken(source, function, replacements))
