"""``respool apply -f FILE`` and ``respool export``: pools, policies and nodes as a YAML file.

The file format is :class:`respool_client.manifest.Manifest` (docs/cli.md). ``apply`` sends it to
``POST /v1/apply``, which plans and applies it in one transaction; ``--dry-run`` gets the same
plan, with the engine's consequences, from a transaction that is rolled back.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
import yaml
from respool_client.manifest import (
    Manifest,
    NodeSpec,
    Plan,
    PolicySpec,
    PoolSpec,
    current_manifest,
    duplicate_names,
    duplicate_nodes,
    naive_instant,
)
from respool_client.wire import Node, Policy, Pool

from cli.api import Api
from cli.common import CliError, confirm
from cli.options import Remote, Shown, Yes
from cli.output import console, emit, print_parts, to_json, to_yaml
from cli.plan_view import plan_lines

__all__ = ["apply", "export", "load_manifest"]


class ExportFormat(StrEnum):
    yaml = "yaml"
    json = "json"


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CliError(f"cannot read {path}: not UTF-8 text") from None


def load_manifest(path: str) -> Manifest:
    """Read and check a manifest (``-`` is stdin); errors name the file and the field."""
    name = "stdin" if path == "-" else path
    try:
        doc: Any = yaml.safe_load(_read(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid syntax"
        raise CliError(f"{name}: not valid YAML{where}: {problem}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise CliError(f"{name}: expected a mapping with a `pools:` list")
    _yaml_times(doc)
    try:
        manifest = msgspec.convert(doc, Manifest, strict=True)
    except msgspec.ValidationError as exc:
        raise CliError(f"{name}: {exc}") from None
    naive = naive_instant(manifest)
    if naive:
        raise CliError(f"{name}: {naive}: a window's instant needs a zone (Z or +01:00)")
    dups = duplicate_names(manifest)
    if dups:
        raise CliError(f"{name}: named more than once: {', '.join(dups)}")
    nodes = duplicate_nodes(manifest)
    if nodes:
        raise CliError(f"{name}: nodes named more than once: {', '.join(nodes)}")
    return manifest


def _yaml_times(doc: dict[str, Any]) -> None:
    """A window's ``from: 17:00`` written without quotes is a YAML 1.1 number (1020, minutes):
    back to ``"17:00"``, as it was written."""
    for pool in doc.get("pools") or []:
        for policy in (pool.get("policies") or []) if isinstance(pool, dict) else []:
            windows = policy.get("windows") if isinstance(policy, dict) else None
            for window in windows if isinstance(windows, list) else []:
                for key in ("from", "to") if isinstance(window, dict) else ():
                    value = window.get(key)
                    if isinstance(value, int) and not isinstance(value, bool) and value < 24 * 60:
                        window[key] = f"{value // 60:02d}:{value % 60:02d}"


def _post(api: Api, manifest: Manifest, *, prune: bool, dry_run: bool, force: bool) -> Plan:
    body: dict[str, Any] = {
        "pools": manifest.pools,
        "prune": prune,
        "dry_run": dry_run,
        "force": force,
    }
    if manifest.nodes is not None:  # left out: the file leaves nodes alone
        body["nodes"] = manifest.nodes
    return api.call("POST", "/v1/apply", Plan, body=body, timeout=120)


def _confirm_deletions(plan: Plan, path: str) -> None:
    """Show a plan that deletes something on stderr and ask before going on."""
    deletions = [c for c in plan.changes if c.action == "delete"]
    if not deletions:
        return
    if path == "-":
        raise CliError("--prune would delete; with -f - (stdin is the file) confirm with --yes")
    print_parts(console(stderr=True), plan_lines(plan))
    n = {k: sum(1 for c in deletions if c.kind == k) for k in ("pool", "policy", "node")}
    what = f"{n['pool']} pools and {n['policy']} policies"
    if n["node"]:
        what = f"{n['pool']} pools, {n['policy']} policies and {n['node']} nodes"
    confirm(f"Delete {what} not in {path}?", yes=False)


def apply(
    file: Annotated[
        str, typer.Option("-f", "--file", help="The manifest (YAML or JSON); - reads stdin.")
    ],
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show the plan and its consequences; change nothing."),
    ] = False,
    prune: Annotated[
        bool,
        typer.Option(
            "--prune",
            help="Delete pools and policies not in the file, and nodes when the file has"
            " `nodes:` (asks unless --yes).",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Let deletions cancel the requests of what they delete, and a node's"
            " deletion or move preempt what it holds.",
        ),
    ] = False,
    yes: Yes = False,
    *,
    shown: Shown,
) -> None:
    """Make pools, policies and nodes match a file, in one transaction; idempotent.

    Pools are matched by name, policies by (pool, subject) and nodes by name; a field left out
    takes its default. A file without `nodes:` leaves nodes alone. With --dry-run the real
    engine runs the change in a transaction that is rolled back, and reports which requests
    would be granted, rejected or preempted.

    Example:

        respool apply -f pools.yaml --dry-run
        respool apply -f pools.yaml --prune --yes
        respool export | respool apply -f - --dry-run
    """
    manifest = load_manifest(file)
    with shown.api() as api:
        if prune and not dry_run and not yes:
            _confirm_deletions(_post(api, manifest, prune=True, dry_run=True, force=force), file)
        plan = _post(api, manifest, prune=prune, dry_run=dry_run, force=force)
    emit(plan, shown.output, lambda: plan_lines(plan))


def _drop_defaults(item: dict[str, Any], spec: type[msgspec.Struct]) -> None:
    """Leave out of an exported ``item`` every field equal to its default in ``spec``:
    msgspec's ``omit_defaults`` compares some values by identity, so a default such as
    ``starvation_seconds: 300`` could still be written."""
    for f in msgspec.structs.fields(spec):
        if f.default is not msgspec.NODEFAULT and item.get(f.encode_name, f) == f.default:
            del item[f.encode_name]


def export(
    output: Annotated[
        ExportFormat, typer.Option("-o", "--output", help="yaml (default) or json.")
    ] = ExportFormat.yaml,
    *,
    remote: Remote,
) -> None:
    """Write every pool, policy and node in the format `respool apply` reads.

    Example:

        respool export > pools.yaml
        respool export | respool apply -f - --dry-run
    """
    with remote.api() as api:
        pools = api.call("GET", "/v1/pools", list[Pool])
        policies = api.call("GET", "/v1/policies", list[Policy])
        nodes = api.call("GET", "/v1/nodes", list[Node])
    doc = msgspec.to_builtins(current_manifest(pools, policies, nodes))
    for pool in doc["pools"]:
        _drop_defaults(pool, PoolSpec)
        for policy in pool.get("policies", []):
            _drop_defaults(policy, PolicySpec)
    for node in doc["nodes"] or []:
        _drop_defaults(node, NodeSpec)
    if not doc["nodes"]:
        del doc["nodes"]  # no node: a file that leaves nodes alone
    if output is ExportFormat.json:
        typer.echo(to_json(doc))
    else:
        typer.echo("# respool pools, policies and nodes: `respool apply -f FILE` restores them")
        typer.echo(to_yaml(doc), nl=False)
