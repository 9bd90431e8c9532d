"""``/v1/nodes``: the machines that back a pool (docs/placement.md): register, list (by pool and
label selector), read, update, delete, and cordon / drain / uncordon. Admin writes, every role
reads but agents, which read, register and update only their own node (:mod:`app.api.auth`); a
client token sees the request id and subject of an allocation only when its globs cover the
subject (docs/api.md)."""

from __future__ import annotations

import re
from typing import Annotated

import msgspec
from litestar import Controller, delete, get, patch, post
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, QueryParameter
from respool_client.wire import LABEL_KEY_PATTERN, Node, NodeCreate, NodeUpdate

from app.api.auth import agent_node_write, subject_reader
from app.api.common import AnyRequest, StrictBody, db, decode_body, sent
from app.api.errors import ApiError, error_responses
from app.db import nodes as db_nodes

_LABEL_KEY = re.compile(LABEL_KEY_PATTERN)

_Force = Annotated[
    bool,
    QueryParameter(
        description="Preempt the node's allocations at once (reason node_removed) instead of"
        " refusing with 409"
    ),
]
_WRITES = error_responses(400, 404, 409)  # the answers of a write besides its own
_Pool = Annotated[str | None, QueryParameter(description="Only the nodes of this pool (a ref)")]
_Selector = Annotated[
    list[str] | None,
    QueryParameter(
        description="label=value (repeatable): only nodes carrying every such label; the"
        " built-in label node is the node's name"
    ),
]


def parse_selector(pairs: list[str] | None) -> dict[str, str]:
    """``["gpu-type=A100", "node=n1"]`` → ``{"gpu-type": "A100", "node": "n1"}``; 400 naming
    ``selector`` for a pair without ``=`` or with a bad label key."""
    selector: dict[str, str] = {}
    for pair in pairs or ():
        key, eq, value = pair.partition("=")
        if not eq or not _LABEL_KEY.match(key):
            raise ApiError(
                400,
                f"selector: expected label=value with a label matching {LABEL_KEY_PATTERN},"
                f" got {pair[:80]!r}",
                "selector",
            )
        selector[key] = value
    return selector


def visible_node(request: AnyRequest, node: Node) -> Node:
    """``node`` as the caller may see it: an allocation of a subject it may not read keeps its
    status, units and devices (the node's usage) but not its request id and subject."""
    may_read = subject_reader(request)
    if all(may_read(a.subject) for a in node.allocations):
        return node
    allocations = [
        a if may_read(a.subject) else msgspec.structs.replace(a, request_id=None, subject=None)
        for a in node.allocations
    ]
    return msgspec.structs.replace(node, allocations=allocations)


def _state_route(verb: str, to: db_nodes.NodeState, summary: str) -> HTTPRouteHandler:
    """``POST /v1/nodes/{name}/<verb>``: the node's state becomes ``to``; the node as it is."""

    async def set_state(self: Controller, state: State, name: FromPath[str]) -> Node:
        return await db_nodes.set_node_state(db(state), name, to)

    set_state.__name__ = f"{verb}_node"
    path = f"/{{name:str}}/{verb}"
    return post(path, status_code=200, summary=summary, responses=error_responses(404))(set_state)


class NodeController(Controller):
    path = "/v1/nodes"
    tags = ["nodes"]

    @post(
        "/", status_code=201, summary="Register a node (in a pool, or in none)", responses=_WRITES
    )
    async def create_node(
        self, state: State, request: AnyRequest, data: StrictBody[NodeCreate]
    ) -> Node:
        body = await decode_body(request, NodeCreate)
        doc = msgspec.structs.asdict(body)
        doc["pool"] = agent_node_write(
            request, body.name, pool=body.pool, pool_given=body.pool is not None, creating=True,
            state=body.state != "active",
        )  # fmt: skip
        return await db_nodes.create_node(db(state), doc)

    @get(
        "/",
        summary="List nodes by name (of one pool; matching a label selector)",
        responses=error_responses(400, 404),
    )
    async def list_nodes(
        self, state: State, request: AnyRequest, pool: _Pool = None, selector: _Selector = None
    ) -> list[Node]:
        found = await db_nodes.list_nodes(db(state), pool=pool, selector=parse_selector(selector))
        return [visible_node(request, n) for n in found]

    @get(
        "/{name:str}",
        summary="One node, its devices and allocations",
        responses=error_responses(404),
    )
    async def get_node(self, state: State, request: AnyRequest, name: FromPath[str]) -> Node:
        return visible_node(request, await db_nodes.get_node(db(state), name))

    @patch(
        "/{name:str}",
        summary="Update a node (labels and capacity merge; devices replace a key's list;"
        " pool moves it)",
        responses=error_responses(400, 404, 409),
    )
    async def update_node(
        self,
        state: State,
        request: AnyRequest,
        name: FromPath[str],
        data: StrictBody[NodeUpdate],
        force: _Force = False,
    ) -> Node:
        body = await decode_body(request, NodeUpdate)
        changes = sent(body)
        agent_node_write(
            request, name, pool=changes.get("pool"), pool_given="pool" in changes,
            creating=False, state="state" in changes, force=force,
        )  # fmt: skip
        return await db_nodes.update_node(db(state), name, changes, force=force)

    @delete(
        "/{name:str}",
        status_code=204,
        summary="Delete a node (force preempts its allocations)",
        responses=error_responses(404, 409),
    )
    async def delete_node(self, state: State, name: FromPath[str], force: _Force = False) -> None:
        await db_nodes.delete_node(db(state), name, force=force)

    cordon_node = _state_route(
        "cordon", "cordoned", "Cordon a node: no new grants, its holders keep their units"
    )
    drain_node = _state_route(
        "drain", "draining", "Drain a node: cordoned, and its preemptible holders are preempted"
    )
    uncordon_node = _state_route(
        "uncordon", "active", "Uncordon a node: active again, grants what now fits"
    )
