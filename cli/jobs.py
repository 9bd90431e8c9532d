"""``respool jobs`` (squeue-like) and ``respool logs ID [-f]`` (docs/jobs.md, "The CLI")."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from respool_client.agent import main as agent_main
from respool_client.wire import Request

from cli.complete import complete_pool
from cli.fetch import list_requests, resolve_request
from cli.options import Remote, Shown
from cli.output import emit
from cli.tables import short, table

__all__ = ["agent", "jobs", "logs"]

LIVE = "live"
SCAN = 1000  # requests read to find the jobs among them


def _elapsed(r: Request) -> str:
    start = r.allocated_at
    if start is None:
        return "-"
    end = r.updated_at if r.terminal else datetime.now(UTC)
    secs = max(0, int((end - start).total_seconds()))
    h, rest = divmod(secs, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def _node(r: Request) -> str:
    placed = r.placement or r.last_placement
    return placed.node if placed is not None else "-"


def jobs_table(found: list[Request], empty: str) -> Any:
    out = table("ID", "NAME", "SUBJECT", "STATE", "NODE", "GPUS", "TIME", "EXIT", empty=empty)
    for r in found:
        assert r.job is not None
        out.add_row(
            short(r.id),
            r.job.name or r.job.command[0].rsplit("/", 1)[-1],
            r.subject,
            r.status,
            _node(r),
            str(r.resources.get("gpu", 0)),
            _elapsed(r),
            "-" if r.exit_code is None else str(r.exit_code),
        )
    return out


def jobs(
    pool: Annotated[
        str | None, typer.Option("--pool", help="Only this pool.", autocompletion=complete_pool)
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", "-a", help="Finished jobs too (default: live ones).")
    ] = False,
    *,
    shown: Shown,
) -> None:
    """List jobs like squeue: ID NAME SUBJECT STATE NODE GPUS TIME EXIT, newest first; live
    ones (queued, allocated, preempting) unless --all.

    Example:

        respool jobs
        respool jobs --pool gpus --all
    """
    with shown.api() as api:
        found = [
            r
            for r in list_requests(api, pool=pool, status=None if every else LIVE, limit=SCAN)
            if r.job is not None
        ]
    empty = "no jobs" if every else "no live jobs (--all shows finished ones too)"
    emit(found, shown.output, lambda: [jobs_table(found, empty)])


def logs(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job (request) id or a prefix.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the attempt ends.")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="This attempt (default: the current).")
    ] = None,
    *,
    remote: Remote,
) -> None:
    """Print a job's output (stdout, and stderr to stderr); -f follows it to the end.

    Example:

        respool logs 3f2a9c1e
        respool logs 3f2a9c1e -f --attempt 2
    """
    after = -1
    with remote.api() as api:
        rid = resolve_request(api, job_id)
        while True:
            params: dict[str, Any] = {"after": after, "attempt": attempt}
            if follow:
                params["wait"] = 30
            page = api.call("GET", f"/v1/requests/{rid}/logs", dict, params=params, timeout=45)
            attempt = page["attempt"]
            for chunk in page["chunks"]:
                stream = sys.stderr if chunk["stream"] == "stderr" else sys.stdout
                stream.write(chunk["data"])
                stream.flush()
            after = max(after, page["next"])
            if not follow or (page["done"] and not page["chunks"]):
                break


def agent(ctx: typer.Context) -> None:
    """Run the jobs granted to this node: respool agent --node NAME (or --pool P), with a token
    of role agent (RESPOOL_TOKEN); --register --detect first registers the node with what
    nvidia-smi and the OS say. `respool agent --help` lists its options; docs/jobs.md says what
    it does."""
    raise typer.Exit(agent_main(list(ctx.args)))
