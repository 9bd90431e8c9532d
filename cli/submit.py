"""``respool submit``: a job (a request that carries a command) for the node agents to run
(docs/jobs.md, "The CLI"). The request options are ``respool request create``'s."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
import yaml
from respool_client.wire import (
    JobSpec,
    Request,
    RequestBatch,
    RequestBatchCreate,
)

from cli.common import fail
from cli.options import Remote
from cli.output import note
from cli.request_options import RequestFields

__all__ = ["submit"]

ENDED = frozenset({"released", "cancelled", "expired", "preempted", "rejected"})


def submit(
    ctx: typer.Context,
    subject: Annotated[
        str, typer.Option("--subject", "-s", envvar="RESPOOL_SUBJECT", help="Who asks.")
    ],
    fields: RequestFields,
    array: Annotated[
        int | None,
        typer.Option("--array", min=1, max=1000, help="N jobs; job i gets RESPOOL_ARRAY_INDEX=i."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="The job's name.")] = None,
    workdir: Annotated[
        str | None, typer.Option("--workdir", help="Run it in this directory.")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", metavar="NAME=VALUE", help="Repeat for more.")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="The job as YAML (gpuctl's kind: job).")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the job(s) to end; exit with its exit code.")
    ] = False,
    *,
    remote: Remote,
) -> None:
    """Submit CMD as a job and go home: the agent of the node it is granted on runs it.

    Prints the job's id (one per line with --array). `respool jobs` lists jobs, `respool logs
    ID -f` follows the output, `respool request cancel ID` stops it.

    Example:

        respool submit -s team:vision --pool a100s --gpu 4 --name train -- python train.py
        respool submit -s team:vision --gpu 1 --array 10 -- python sweep.py
        respool submit -s team:vision -f job.yaml
    """
    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    job: dict[str, Any] = {"name": name, "workdir": workdir}
    job["env"] = dict(_pair(p) for p in env or []) or None
    if file is not None:
        from_file, job_file = _job_file(file)
        job.update({k: v for k, v in job_file.items() if v is not None})
        if argv:
            fail("give CMD or --file, not both")
        argv = job_file["command"]
        fields = replace(
            fields,
            pool=fields.pool or from_file["pool"],
            gpu=fields.gpu if fields.gpu is not None else from_file["gpu"],
            cpu=fields.cpu if fields.cpu is not None else from_file["cpu"],
            memory=fields.memory or from_file["memory"],
        )
    if not argv:
        raise typer.BadParameter("no command: respool submit [options] -- CMD [ARGS...]")
    body = fields.body(subject)
    extra = {k: v for k, v in job.items() if v and k != "command"}
    spec = JobSpec(command=[str(a) for a in argv], **extra)
    body = msgspec.structs.replace(body, job=spec)
    with remote.api() as api:
        if array is None:
            made = [api.call("POST", "/v1/requests", Request, body=body)]
        else:
            batch = RequestBatchCreate(members=[body] * array, array=True)
            made = api.call("POST", "/v1/requests/batch", RequestBatch, body=batch).items
        for r in made:
            typer.echo(str(r.id))
        if any(r.status == "rejected" for r in made):
            note(f"rejected: {made[0].message}")
            raise typer.Exit(1)
        if wait:
            raise typer.Exit(_wait(api, made))


def _wait(api: Any, made: list[Request]) -> int:
    """Until every job ended; the first non-zero exit code (1 when one ended without one)."""
    worst = 0
    for r in made:
        doc = r
        while doc.status not in ENDED:
            doc = api.call(
                "GET",
                f"/v1/requests/{doc.id}",
                Request,
                params={"wait": 30, "version": doc.version},
                timeout=45,
            )
        code = (
            doc.exit_code if doc.exit_code is not None else (0 if doc.status == "released" else 1)
        )
        note(f"job {doc.id}: {doc.status}, exit code {doc.exit_code}")
        worst = worst or code
    return worst


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"NAME=VALUE, not {text!r}", param_hint="--env")
    return key, value


def _job_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(request fields, job fields) of a job file in gpuctl's shape: ``kind: job``,
    ``resources: {pool, gpu, cpu, memory}``, ``command``, ``env``, ``workdir``, ``name``
    (``job:`` may hold them too)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"{path}: {exc}")
    if not isinstance(doc, dict) or str(doc.get("kind", "job")).lower() != "job":
        fail(f"{path}: not a job file (kind: job)")
    nested = doc.get("job")
    inner: dict[str, Any] = nested if isinstance(nested, dict) else {}

    def get(key: str) -> Any:
        return inner.get(key, doc.get(key))

    res = doc.get("resources") or {}
    if not isinstance(res, dict):
        fail(f"{path}: resources: a map (pool, gpu, cpu, memory)")
    command = get("command")
    if isinstance(command, str):
        command = [command]
    if not isinstance(command, list) or not command:
        fail(f"{path}: command: a non-empty list (an argv)")
    env = get("env")
    if isinstance(env, list):  # [{name, value}] as in Kubernetes
        env = {e["name"]: str(e.get("value", "")) for e in env if isinstance(e, dict)}
    fields = {
        "pool": res.get("pool"),
        "gpu": None if res.get("gpu") is None else int(res["gpu"]),
        "cpu": None if res.get("cpu") is None else Decimal(str(res["cpu"])),
        "memory": None if res.get("memory") is None else str(res["memory"]),
    }
    job = {
        "command": [str(a) for a in command],
        "env": {str(k): str(v) for k, v in (env or {}).items()} or None,
        "workdir": get("workdir"),
        "name": get("name") or (doc.get("metadata") or {}).get("name"),
    }
    return fields, job
