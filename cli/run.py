"""``respool run [options] -- CMD [ARGS...]``: the client's command wrapper (respool_client.run),
served by the server CLI too; every option and the exit codes are the client's."""

from __future__ import annotations

import typer
from respool_client.run import main as run_main

__all__ = ["run"]


def run(ctx: typer.Context) -> None:
    """Run CMD under an allocation: wait, run, stop CMD's whole group, re-run, release.

    Options: --subject, --pool, --gpu, --cpu, --memory, --resource KEY=N, --non-preemptible,
    --max-retries, --lease (none: no lease), --queue-lease, --timeout, --kill-after,
    --selector LABEL=VALUE, --node NAME, --here, --group G (preemption group);
    `respool run --help` lists them all, docs/client.md says what happens to CMD's processes.
    """
    raise typer.Exit(run_main(list(ctx.args)))
