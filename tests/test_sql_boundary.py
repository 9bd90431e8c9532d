"""The SQL boundary: every statement Python runs is a named query in ``sql/queries/*.sql``.

(a) every named query parses, is used by some module under ``app/`` or ``cli/``, and is valid
    against a migrated database (prepared, never executed);
(b) no Python string literal under ``app/`` or ``cli/`` looks like SQL, and nothing calls a
    private ``respool._`` function (neither Python nor the named queries).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from app.db import named
from app.db.named import parse, query, query_names
from app.db.sqlfiles import sql_dir

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("app", "cli")

# A literal that starts like a statement: an upper-case keyword followed by more text.
SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|GRANT|REVOKE|LISTEN|NOTIFY|SET|WITH|DO)"
    r"\s+\S"
)
PRIVATE_CALL = re.compile(r"\brespool\._\w+\s*\(")


def _python_files() -> Iterator[Path]:
    for top in SOURCES:
        yield from sorted((ROOT / top).rglob("*.py"))


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (module, class, function)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _literal_text(node: ast.AST) -> str | None:
    """The text of a string literal; an f-string's placeholders become ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
            for v in node.values
        )
    return None


def sql_like_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every non-docstring string literal in ``source`` that looks like SQL
    or calls a private ``respool._`` function."""
    tree = ast.parse(source)
    docstrings = _docstring_nodes(tree)
    inside_fstring = {
        id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values
    }
    out = []
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in inside_fstring:
            continue
        text = _literal_text(node)
        if text is not None and (SQL_START.match(text) or PRIVATE_CALL.search(text)):
            out.append((getattr(node, "lineno", 0), text))
    return out


# The helpers that run a named query, and which positional argument names it:
# query(name), fetch_as(db, kind, name, ...) and app.db.metrics._query_rows(name, row).
_NAME_ARGUMENT = {"query": 0, "fetch_as": 2, "_query_rows": 0}


def _used_query_names() -> dict[str, list[str]]:
    """Each name passed as a literal to a helper that runs a named query, with where."""
    used: dict[str, list[str]] = {}
    for path in _python_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            position = _NAME_ARGUMENT.get(called or "")
            if position is None or len(node.args) <= position:
                continue
            arg = node.args[position]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                used.setdefault(arg.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return used


# --- (b) the scan itself can fail ------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ('x = "SELECT 1"', True),
        ("x = f'DROP VIEW IF EXISTS respool.{view} CASCADE'", True),
        ('x = ("INSERT INTO t (a)"\n     " VALUES ($1)")', True),
        ('x = "SELECT respool.get_pool(p_ref => $1)"', True),
        ('x = "LISTEN respool_request"', True),
        ('x = "pick respool._blocker(a, b)"', True),
        ('x = "Create a pool"', False),
        ('x = "DELETE"', False),  # an HTTP method
        ('x = query("create_pool")', False),
        ('def f():\n    """SELECT is mentioned in a docstring."""', False),
    ],
)
def test_scan_flags_sql_literals(source: str, flagged: bool) -> None:
    assert bool(sql_like_literals(source)) is flagged


def test_no_sql_literals_in_python() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
        for path in _python_files()
        for line, text in sql_like_literals(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "SQL belongs in sql/queries/*.sql:\n" + "\n".join(found)


def test_named_queries_call_no_private_functions() -> None:
    private = {
        name: PRIVATE_CALL.findall(query(name))
        for name in query_names()
        if PRIVATE_CALL.search(query(name))
    }
    assert private == {}


# --- (a) the named queries -------------------------------------------------------------------


def test_every_block_parses_with_a_description() -> None:
    """Each block has a one-line description and holds one statement."""
    files = sorted((sql_dir() / "queries").iterdir(), key=lambda e: e.name)
    names: list[str] = []
    for entry in files:
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        blocks = parse(text, entry.name)
        assert blocks, f"{entry.name}: no named queries"
        for name, statement in blocks.items():
            header = re.search(rf"^--\s*{name}\s*--\s*\n(.*)$", text, re.MULTILINE)
            assert header and header.group(1).startswith("-- "), f"{name}: no description line"
            body = statement.rstrip().rstrip(";")
            if not body.lstrip().startswith("DO "):
                assert ";" not in body, f"{name}: more than one statement"
        names += blocks
    assert sorted(names) == sorted(query_names())


def test_parse_refuses_duplicates_and_empty_blocks() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        parse("-- a --\n-- one\nSELECT 1;\n-- a --\n-- two\nSELECT 2;\n")
    with pytest.raises(ValueError, match="no statement"):
        parse("-- a --\n-- nothing here\n")


def test_every_named_query_is_used() -> None:
    used = _used_query_names()
    assert sorted(query_names() - used.keys()) == [], "named queries no module runs"
    unknown = {name: where for name, where in used.items() if name not in query_names()}
    assert unknown == {}, "query() names with no block in sql/queries"


async def test_every_named_query_prepares(conn: asyncpg.Connection) -> None:
    """Each statement is valid against the migrated schema: tables, columns, functions
    (named arguments included) and parameter types resolve. Prepared only, then rolled back."""
    named._all.cache_clear()  # read the files as they are now
    failures: dict[str, str] = {}
    for name in sorted(query_names()):
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.prepare(query(name))
        except asyncpg.PostgresError as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
        finally:
            await tx.rollback()
    assert failures == {}
