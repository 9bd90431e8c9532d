"""Nodes (``sql/queries/nodes.sql``): typed wrappers around the engine's node functions
(docs/placement.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from respool_client.wire import Node

from app.db.errors import engine_errors
from app.db.executor import Executor, _as
from app.db.named import query

NodeState = Literal["active", "cordoned", "draining"]


@engine_errors
async def create_node(db: Executor, body: Mapping[str, Any]) -> Node:
    """Register a node from a ``NodeCreate`` body (name, pool, labels, capacity, devices, state)."""
    return _as(Node, await db.fetchval(query("create_node"), dict(body)))


@engine_errors
async def update_node(
    db: Executor, name: str, body: Mapping[str, Any], *, force: bool = False
) -> Node:
    """Update a node from the fields of a ``NodeUpdate`` body that were sent; ``force`` preempts
    the allocations a move out of its pool displaces."""
    return _as(Node, await db.fetchval(query("update_node"), name, dict(body), force))


@engine_errors
async def delete_node(db: Executor, name: str, *, force: bool = False) -> None:
    await db.execute(query("delete_node"), name, force)


@engine_errors
async def set_node_state(db: Executor, name: str, state: NodeState) -> Node:
    return _as(Node, await db.fetchval(query("set_node_state"), name, state))


@engine_errors
async def get_node(db: Executor, name: str) -> Node:
    return _as(Node, await db.fetchval(query("get_node"), name))


@engine_errors
async def list_nodes(
    db: Executor, *, pool: str | None = None, selector: Mapping[str, str] | None = None
) -> list[Node]:
    """Nodes by name, of one pool or all, whose labels match every pair of ``selector``
    (the built-in label ``node`` is the node's name)."""
    return _as(list[Node], await db.fetchval(query("list_nodes"), pool, dict(selector or {})))
