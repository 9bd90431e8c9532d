"""``respool node ...``: the machines behind pools (docs/cli.md, "Nodes"; docs/placement.md).

The shapes are kubectl's and gpuctl's: ``node label NAME k=v k-`` with ``--overwrite``, the
label ``pool`` moves a node between pools, ``cordon``/``uncordon``/``drain``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from respool_client.detect import Machine, detect, memory_map, node_path, registration, sharing_map
from respool_client.pairs import host_node_name, split_pair
from respool_client.wire import Node
from rich.console import RenderableType
from rich.text import Text

from cli.api import Api
from cli.common import CliError, confirm
from cli.complete import complete_pool
from cli.help import with_examples
from cli.maps import parse_labels, parse_selector
from cli.options import Remote, Shown, Typer, Yes, map_option
from cli.output import emit, note
from cli.tables import (
    node_allocations_table,
    node_devices_table,
    node_header,
    node_keys_table,
    nodes_table,
)

__all__ = ["POOL_LABEL", "app", "parse_devices", "parse_selector"]

app = Typer(
    help="Nodes: the machines behind a pool, their devices, labels and state.",
    no_args_is_help=True,
)

# ``node label NAME pool=P`` moves the node to pool P, as gpuctl's pool label does.
POOL_LABEL = "pool"

NodeName = Annotated[str, typer.Argument(help="The node's name.")]
NewNodeName = Annotated[
    str, typer.Argument(help="Node name: lower-case letters, digits, '.', '_' and '-'.")
]
HostName = Annotated[
    str | None,
    typer.Option("--name", help="The node's name (default: this machine's hostname)."),
]
Detect = Annotated[
    bool,
    typer.Option(
        "--detect",
        help="Find GPUs with nvidia-smi and mcpu, memory_mb from the OS. The gpu device ids"
        " are the GPU indices (what CUDA_VISIBLE_DEVICES takes), or on a MIG machine the MIG"
        " UUIDs (a MIG instance has no index); a gpu-type label from the product name.",
    ),
]
LabelChanges = Annotated[
    list[str],
    typer.Argument(
        metavar="LABELS...",
        help="KEY=VALUE sets a label, KEY- removes it; pool=P moves the node to pool P,"
        " pool- takes it out of its pool.",
    ),
]
Overwrite = Annotated[
    bool, typer.Option("--overwrite", help="Let KEY=VALUE change a label that has a value.")
]
PoolOpt = Annotated[
    str | None,
    typer.Option(
        "--pool",
        help="The pool it backs (name, id or id prefix).",
        autocompletion=complete_pool,
    ),
]
Capacity = Annotated[
    dict[str, int] | None,
    map_option(
        "-c",
        "--capacity",
        help="""Units per key, JSON or YAML: '{"gpu": 8, "mcpu": 64000}'. A key given by"""
        " --devices may be left out (its units are its ids).",
    ),
]
Devices = Annotated[
    list[str] | None,
    typer.Option(
        "--devices",
        help="Named devices of a key in order, e.g. gpu=0,1,2,3 (GPU indices, UUIDs or MIG"
        " ids: what CUDA_VISIBLE_DEVICES takes); repeat for another key.",
        metavar="KEY=ID,ID,...",
    ),
]
Labels = Annotated[
    list[str] | None,
    typer.Option("--label", "-l", metavar="KEY=VALUE", help="A label, e.g. gpu-type=A100-80G."),
]
Sharing = Annotated[
    list[str] | None,
    typer.Option(
        "--sharing",
        metavar="KEY=MODE",
        help="Share each device of a key in slices: gpu=mps (memory and compute limits set by"
        " MPS) or gpu=time-slicing (not enforced by the driver); needs --device-memory (found"
        " by --detect).",
    ),
]
DeviceMemory = Annotated[
    list[str] | None,
    typer.Option(
        "--device-memory",
        metavar="KEY=SIZE",
        help="Each device's memory of a shared key: gpu=81920 (MiB) or gpu=80GiB.",
    ),
]
ReservedMemory = Annotated[
    list[str] | None,
    typer.Option(
        "--reserved-memory",
        metavar="KEY=SIZE",
        help="Memory kept back on each device of a shared key for the driver: gpu=512 (default 0).",
    ),
]
Selector = Annotated[
    list[str] | None,
    typer.Option(
        "--selector", metavar="KEY=VALUE", help="Only nodes with this label; repeat: all of them."
    ),
]
NodeForce = Annotated[
    bool,
    typer.Option(
        "--force", help="Even while it holds allocations: they are preempted (node_removed)."
    ),
]


def parse_devices(items: Iterable[str]) -> dict[str, list[str]]:
    """``["gpu=0,1", "nic=a"]`` → ``{"gpu": ["0", "1"], "nic": ["a"]}``; ids trimmed, each key
    once, no empty or repeated id (the server checks the key and the id lengths)."""
    out: dict[str, list[str]] = {}
    for item in items:
        try:
            key, value = split_pair(item)
        except ValueError:
            raise typer.BadParameter(
                f"{item!r}: expected KEY=ID,ID,... (gpu=0,1,2,3)", param_hint="--devices"
            ) from None
        ids = [d.strip() for d in value.split(",")]
        if key in out:
            raise typer.BadParameter(f"{key}: given twice", param_hint="--devices")
        if not value or any(not d for d in ids):
            raise typer.BadParameter(
                f"{key}: an empty device id in {value!r}", param_hint="--devices"
            )
        repeated = sorted({d for d in ids if ids.count(d) > 1})
        if repeated:
            raise typer.BadParameter(
                f"{key}: device {', '.join(repeated)} listed twice", param_hint="--devices"
            )
        out[key] = ids
    return out


def _node_view(node: Node) -> list[RenderableType]:
    parts: list[RenderableType] = [node_header(node), Text(), node_keys_table(node)]
    if node.devices:
        parts += [Text(), node_devices_table(node)]
    parts.append(Text())
    if node.allocations:
        parts.append(node_allocations_table(node))
    else:
        parts.append(Text("Allocations: none", style="bold"))
    return parts


@dataclass(frozen=True)
class NodeUnits:
    """The options that say what a node has: add's and register's."""

    capacity: Capacity = None
    devices: Devices = None
    label: Labels = None
    sharing: Sharing = None
    device_memory: DeviceMemory = None
    reserved_memory: ReservedMemory = None

    def named(self) -> dict[str, list[str]]:
        """``--devices`` as device ids per key."""
        return parse_devices(self.devices or [])

    def shared(self) -> dict[str, str]:
        """``--sharing`` as the mode per device key."""
        try:
            return sharing_map(self.sharing or [])
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--sharing") from None

    def memory(self, option: str) -> dict[str, int]:
        """``--device-memory`` / ``--reserved-memory`` as MiB per device key."""
        items = self.device_memory if option == "--device-memory" else self.reserved_memory
        try:
            return memory_map(items or [], 1 if option == "--device-memory" else 0)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=option) from None

    def sharing_fields(self, found: Machine | None = None) -> dict[str, Any]:
        """The node's sharing fields (docs/placement.md, "Sharing a GPU"): with ``found``
        (--detect) the keys it could share and their memory, the memory given overriding;
        else what was asked. Only the maps that are not empty."""
        sharing = self.shared()
        if found is not None:  # detect decides for the gpu key
            sharing = {k: v for k, v in sharing.items() if k != "gpu"} | found.sharing
        memory = (found.device_memory_mb if found else {}) | self.memory("--device-memory")
        fields = {
            "sharing": sharing,
            "device_memory_mb": memory,
            "reserved_memory_mb": self.memory("--reserved-memory"),
        }
        return {name: value for name, value in fields.items() if value}

    def labels(self) -> dict[str, str]:
        return parse_labels(self.label or [])


@app.command("add")
def add(name: NewNodeName, pool: PoolOpt = None, *, units: NodeUnits, shown: Shown) -> None:
    """Add a node (a machine) to respool, in a pool or in none.

    A pool backed by nodes has their summed capacity; every allocation in it is placed on one
    node and, for a key with --devices, on named devices.

    Example:

        respool node add gpu-01 --pool training -c '{"gpu": 8, "mcpu": 64000}' \\
            --devices gpu=0,1,2,3,4,5,6,7 --label gpu-type=A100-80G
        respool node add gpu-02 --pool notebooks --devices gpu=0,1 \\
            --sharing gpu=mps --device-memory gpu=80GiB --reserved-memory gpu=512
    """
    named = units.named()
    if not units.capacity and not named:
        raise typer.BadParameter("give the node's units: -c '{\"gpu\": 8}' or --devices gpu=0,1")
    method, path, body = registration(
        None,
        name,
        pool=pool,
        capacity=units.capacity or {},
        devices=named,
        labels=units.labels(),
        detected=False,
        **units.sharing_fields(),
    )
    with shown.api() as api:
        node = api.call(method, path, Node, body=body)
    note(f"added node {node.name}" + (f" to pool {node.pool}" if node.pool else " (in no pool)"))
    emit(node, shown.output, lambda: _node_view(node))


def _registration(api: Api, name: str, **units: Any) -> tuple[Node, bool]:
    """Create the node, or make an existing one match what was found
    (:func:`respool_client.detect.registration`, which takes ``units``). Returns (node, created)."""
    old = api.find(node_path(name), Node)
    method, path, body = registration(old, name, **units)
    return api.call(method, path, Node, body=body), old is None


@app.command("register")
def register(
    pool: PoolOpt = None,
    name: HostName = None,
    detect_: Detect = False,
    *,
    units: NodeUnits,
    shown: Shown,
) -> None:
    """Register this machine as a node; registering it again updates it.

    The name defaults to the hostname, lower-cased, other characters made '-' (the name
    `respool run --here` uses). Without --detect, give the capacity with -c (and --devices).
    With --detect, -c, --devices and --label add to or override what was found. Without a
    working nvidia-smi the machine is registered with no GPU, and the command says so.

    Example:

        respool node register --pool training --detect
        respool node register --pool notebooks --detect --sharing gpu=mps
        respool node register --name cpu-07 -c '{"mcpu": 32000, "memory_mb": 128000}'
    """
    try:
        node_name = name if name is not None else host_node_name()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--name") from None
    found = detect(sharing=units.shared()) if detect_ else Machine()
    for line in found.notes:
        note(line)
    given = units.named()
    named = found.devices | given
    capacity = found.capacity | (units.capacity or {})
    for key, ids in given.items():
        if units.capacity is None or key not in units.capacity:
            capacity[key] = len(ids)  # a key listed by --devices has as many units as ids
    if not capacity and not named:
        raise typer.BadParameter(
            "give the machine's units with -c '{\"gpu\": 8}', or let --detect find them",
            param_hint="--capacity",
        )
    labels = found.labels | units.labels()
    with shown.api() as api:
        node, created = _registration(
            api,
            node_name,
            pool=pool,
            capacity=capacity,
            devices=named,
            labels=labels,
            detected=detect_,
            **units.sharing_fields(found if detect_ else None),
        )
    where = f" in pool {node.pool}" if node.pool else " (in no pool)"
    note(f"{'registered' if created else 'updated'} node {node.name}{where}")
    emit(node, shown.output, lambda: _node_view(node))


@app.command("list")
def list_(pool: PoolOpt = None, select: Selector = None, *, shown: Shown) -> None:
    """List nodes: pool, state, used/total per key and labels.

    Example:

        respool node list --pool training
        respool node list --selector gpu-type=A100-80G -o json
    """
    wanted = parse_selector(select or [])
    params: dict[str, Any] = {"pool": pool}
    if wanted:
        params["selector"] = [f"{k}={v}" for k, v in wanted.items()]
    with shown.api() as api:
        nodes = api.call("GET", "/v1/nodes", list[Node], params=params)
    emit(nodes, shown.output, lambda: [nodes_table(nodes)])


@app.command("describe")
def describe(name: NodeName, *, shown: Shown) -> None:
    """Show a node: capacity and usage per key, its devices and who holds each.

    Example:

        respool node describe gpu-01
    """
    with shown.api() as api:
        node = api.call("GET", node_path(name), Node)
    emit(node, shown.output, lambda: _node_view(node))


@dataclass(frozen=True)
class LabelEdit:
    """``node label``'s changes and whether they may change a label that has a value."""

    changes: LabelChanges
    overwrite: Overwrite = False

    def changes_of(self, node: Node) -> tuple[dict[str, str | None], tuple[str | None] | None]:
        """kubectl's rule: ``k=v`` sets, ``k-`` removes; changing a label that has another value
        needs ``--overwrite``. Returns (label changes, (new pool,) or None when the pool stays)."""
        labels: dict[str, str | None] = {}
        pool: tuple[str | None] | None = None
        for item in self.changes:
            if "=" not in item and item.endswith("-") and len(item) > 1:
                key = item[:-1].strip()
                if key == POOL_LABEL:
                    pool = (None,)
                elif key in node.labels:
                    labels[key] = None
                else:
                    note(f"label {key!r} not found on node {node.name}")
                continue
            try:
                key, value = split_pair(item)
            except ValueError:
                raise typer.BadParameter(
                    f"{item!r}: expected KEY=VALUE to set a label or KEY- to remove one",
                    param_hint="LABELS",
                ) from None
            old = node.pool if key == POOL_LABEL else node.labels.get(key)
            if old is not None and old != value and not self.overwrite:
                raise CliError(
                    f"label {key!r} of node {node.name} already has the value {old!r}; "
                    "pass --overwrite to change it"
                )
            if key == POOL_LABEL:
                pool = (value,)
            elif old != value:
                labels[key] = value
        return labels, pool


@app.command("label")
def label(name: NodeName, edit: LabelEdit, force: NodeForce = False, *, shown: Shown) -> None:
    """Set or remove a node's labels (kubectl's rules); the label pool moves it.

    Moving a node out of its pool (pool=Q, pool-) is refused while it holds allocations,
    unless --force preempts them. The label node is built in: it is the node's name.

    Example:

        respool node label gpu-01 gpu-type=A100-80G zone=eu-1
        respool node label gpu-01 zone=eu-2 --overwrite
        respool node label gpu-01 zone-
        respool node label gpu-01 pool=inference --overwrite
    """
    with shown.api() as api:
        node = api.call("GET", node_path(name), Node)
        labels, pool = edit.changes_of(node)
        body: dict[str, Any] = {}
        if labels:
            body["labels"] = labels
        if pool is not None and pool[0] != node.pool:
            body["pool"] = pool[0]
        if body:
            node = api.call(
                "PATCH", node_path(name), Node, body=body, params={"force": str(force).lower()}
            )
            note(f"labelled node {node.name}")
        else:
            note(f"node {node.name} already has these labels")
    emit(node, shown.output, lambda: _node_view(node))


def _state_command(verb: str, doc: str) -> None:
    """Register ``node <verb> NAME``: POST /v1/nodes/NAME/<verb>, then show the node."""

    def command(name: NodeName, *, shown: Shown) -> None:
        with shown.api() as api:
            node = api.call("POST", f"{node_path(name)}/{verb}", Node)
        note(f"node {node.name} is {node.state}")
        emit(node, shown.output, lambda: _node_view(node))

    command.__doc__ = with_examples(doc, f"respool node {verb} gpu-01")
    app.command(verb)(command)


_state_command("cordon", "Take no new grants on the node; what it holds stays.")
_state_command("uncordon", "Make the node active again: it takes grants.")
_state_command(
    "drain",
    "Cordon the node and preempt its preemptible holders (with the pool's grace);"
    " non-preemptible ones finish on their own.",
)


@app.command("delete")
def delete(name: NodeName, yes: Yes = False, force: NodeForce = False, *, remote: Remote) -> None:
    """Delete a node (asks first unless --yes); its pool loses its capacity.

    Refused while it holds allocations, unless --force preempts them.

    Example:

        respool node delete gpu-01 --yes
    """
    with remote.api() as api:
        node = api.call("GET", node_path(name), Node)
        where = f" from pool {node.pool}" if node.pool else ""
        confirm(f"Delete node {node.name}{where}?", yes=yes)
        api.call("DELETE", node_path(node.name), params={"force": str(force).lower()})
    note(f"deleted node {node.name}")
