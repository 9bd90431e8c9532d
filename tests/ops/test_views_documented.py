"""docs/ops.md names every view of schema ``respool`` with all of its columns, in order, and says
in which order a plain ``SELECT *`` of each comes back; the database agrees with both.

The columns are compared with ``information_schema.columns``, so a view that gains a column
fails here until the page lists it. The order is checked on the scripted history
(tests/support/scenario.py), whose pools, holders and events are created out of name and time
order, plus two nodes added in reverse name order.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from support import scenario
from support.db import direct

OPS = Path(__file__).resolve().parents[2] / "docs" / "ops.md"

VIEWS_HEADER = "| view | one row per | columns |"
ORDER_HEADER = "| view | a plain `SELECT *` comes back ordered by |"
UNORDERED = "no order"


def _table(header: str) -> list[list[str]]:
    """The cells of the rows of the table in docs/ops.md whose header line is ``header``."""
    lines = OPS.read_text().splitlines()
    assert header in lines, f"docs/ops.md has no table headed {header!r}"
    rows: list[list[str]] = []
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _view_name(cell: str) -> str:
    match = re.fullmatch(r"`(\w+)`", cell)
    assert match, f"docs/ops.md: a view cell is one name in backticks, got {cell!r}"
    return match[1]


def _names(cell: str) -> list[str]:
    """The comma-separated names in the cell's first backtick span (``"limit"`` as limit)."""
    match = re.match(r"`([^`]+)`", cell)
    assert match, f"docs/ops.md: expected a `column, column, ...` list, got {cell!r}"
    return [name.strip().strip('"') for name in match[1].split(",")]


def documented_columns() -> dict[str, list[str]]:
    return {_view_name(row[0]): _names(row[2]) for row in _table(VIEWS_HEADER)}


def documented_order() -> dict[str, list[str]]:
    """View -> the columns its rows are sorted by ([] for a view documented as unordered)."""
    return {
        _view_name(row[0]): [] if row[1].startswith(UNORDERED) else _names(row[1])
        for row in _table(ORDER_HEADER)
    }


async def view_columns(conn: asyncpg.Connection) -> dict[str, list[str]]:
    rows = await conn.fetch(
        "SELECT c.table_name, array_agg(c.column_name::text ORDER BY c.ordinal_position) AS cols"
        "  FROM information_schema.columns c"
        "  JOIN information_schema.views v"
        "    ON v.table_schema = c.table_schema AND v.table_name = c.table_name"
        " WHERE c.table_schema = 'respool'"
        " GROUP BY c.table_name"
    )
    return {r["table_name"]: list(r["cols"]) for r in rows}


# --- the columns ----------------------------------------------------------------------------


async def test_every_view_is_documented_with_all_its_columns_in_order(
    conn: asyncpg.Connection,
) -> None:
    actual = await view_columns(conn)
    documented = documented_columns()
    assert sorted(documented) == sorted(actual), "views in docs/ops.md vs in schema respool"
    for view, columns in actual.items():
        assert documented[view] == columns, f"docs/ops.md, view {view}: columns"


def test_every_view_documented_has_its_order_documented() -> None:
    assert sorted(documented_order()) == sorted(documented_columns())
    for view, order in documented_order().items():
        assert set(order) <= set(documented_columns()[view]), view


# --- the order of SELECT * -------------------------------------------------------------------


@pytest.fixture(scope="module")
async def filled(module_db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The scripted history, a live holder and waiter, and two nodes (``z9`` before ``b2``) in a
    pool created last (``anodes``: first by name)."""
    async with direct(module_db_url) as conn:
        await scenario.history(conn)
        await scenario.live(conn)
        await conn.execute("SELECT respool.create_pool(p_name => 'anodes', p_capacity => '{}')")
        await conn.execute(
            "SELECT respool.create_policy(p_subject => 'team-n', p_pool => 'anodes')"
        )
        for node in ("z9", "b2"):
            await conn.execute(
                "SELECT respool.create_node($1)",
                {"name": node, "pool": "anodes", "capacity": {"gpu": 2, "mcpu": 4000},
                 "devices": {"gpu": ["1", "0"]}},
            )  # fmt: skip
        for _ in range(2):
            made = await conn.fetchval(
                "SELECT (respool.create_request($1)).request",
                {"subject": "team-n", "pool": "anodes", "resources": {"gpu": 1}},
            )
            assert made["status"] == "allocated", made
        # Rate keys (docs/rates.md): two keys, charged by two subjects.
        await conn.execute(
            "SELECT respool.create_pool(p_name => 'rates', p_rates => $1)",
            {
                "tokens": {"amount": 1000, "per_seconds": 60},
                "calls": {"amount": 9, "per_seconds": 60},
            },
        )
        for subject in ("team-z", "team-a"):
            await conn.execute(
                "SELECT respool.create_policy(p_subject => $1, p_pool => 'rates')", subject
            )
            await conn.fetchval(
                "SELECT (respool.create_request($1)).request",
                {"subject": subject, "pool": "rates", "resources": {"tokens": 10, "calls": 1}},
            )
        yield conn


def _sort_key(columns: list[str]) -> Any:
    def key(row: asyncpg.Record) -> tuple[Any, ...]:
        # NULLs last, as PostgreSQL sorts them ascending.
        return tuple((row[c] is None, "" if row[c] is None else row[c]) for c in columns)

    return key


ORDERED = [view for view, order in documented_order().items() if order]


@pytest.mark.parametrize("view", ORDERED)
async def test_select_star_comes_back_in_the_documented_order(
    filled: asyncpg.Connection, view: str
) -> None:
    order = documented_order()[view]
    rows = await filled.fetch(f"SELECT * FROM respool.{view}")  # noqa: S608 (names from the doc)
    assert rows == sorted(rows, key=_sort_key(order)), f"{view}: not ordered by {order}"


async def test_the_scripted_history_fills_every_ordered_view(filled: asyncpg.Connection) -> None:
    """Each order above is checked on at least two rows (invariant_violations: none when
    healthy; its order is checked on broken counters below)."""
    for view in ORDERED:
        n = await filled.fetchval(f"SELECT count(*) FROM respool.{view}")  # noqa: S608
        assert n >= 2 or view in ("invariant_violations", "policy_subjects"), (view, n)


async def test_invariant_violations_come_back_in_the_documented_order(
    filled: asyncpg.Connection,
) -> None:
    order = documented_order()["invariant_violations"]
    tx = filled.transaction()
    await tx.start()
    try:
        # Break every policy and node counter (I4 rows in several pools), then undo.
        await filled.execute("UPDATE respool.policy_resources SET used = used + 1")
        await filled.execute("UPDATE respool.node_resources SET used = used + 1")
        rows = await filled.fetch("SELECT * FROM respool.invariant_violations")
    finally:
        await tx.rollback()
    assert len({r["pool"] for r in rows}) >= 3, rows
    assert rows == sorted(rows, key=_sort_key(order))
