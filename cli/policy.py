"""``respool pool attach-policy|detach-policy|list-policies``: the subject policies of pools.

Registered under ``respool pool`` (see :mod:`cli.pool`); the command names stay the pool's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer
from respool_client.wire import Policy

from cli.api import Api
from cli.common import CliError, confirm, given_of
from cli.complete import complete_subject
from cli.options import Description, Force, PoolRef, Remote, Shown, Typer, Yes, map_option
from cli.output import emit, note
from cli.tables import policies_table
from cli.windows import parse_windows

__all__ = ["app"]

app = Typer()

Subject = Annotated[
    str,
    typer.Argument(
        help="Workload component, e.g. orchestrator:prod, or a pattern with * for a team's"
        " shared quota, e.g. 'team-vision:*' (quote it in a shell).",
        autocompletion=complete_subject,
    ),
]
Detached = Annotated[str, typer.Argument(help="The subject to detach.")]
OnlyPool = Annotated[str | None, typer.Argument(help="Only this pool (name, id or prefix).")]
OnlySubject = Annotated[
    str | None,
    typer.Option("--subject", help="Only this subject.", autocompletion=complete_subject),
]


@dataclass(frozen=True)
class PolicyFields:
    """The options that set a policy's fields (``attach-policy`` creates or updates)."""

    priority: Annotated[
        int | None, typer.Option("-p", "--priority", help="Higher is preferred (default 0).")
    ] = None
    reserved: Annotated[
        dict[str, int] | None,
        map_option(
            "-r",
            "--reserved",
            help="Reserved share per key, JSON or YAML (merges on update; 0 removes a key).",
        ),
    ] = None
    limit: Annotated[
        dict[str, int] | None,
        map_option(
            "-l",
            "--limit",
            help="Hard ceiling per key, JSON or YAML (merges on update; 0 removes a key).",
        ),
    ] = None
    description: Description = None
    lane: Annotated[
        bool | None,
        typer.Option(
            "--lane/--no-lane",
            help="Priority lane: its requests come before every other request and may preempt"
            " borrowing allocations of other policies whatever their priority (default: no lane).",
            show_default=False,
        ),
    ] = None
    window: Annotated[
        list[str] | None,
        typer.Option(
            "--window",
            metavar="WINDOW",
            help="When the reserved share is in force; repeat for more (replaces the policy's"
            " windows): 'mon-fri 09:00-17:00 Europe/Berlin', '09:00-17:00 UTC' (every day),"
            " 'mon,wed,fri 22:00-06:00 UTC' (crosses midnight),"
            " START/END in ISO with a zone (one time, see the examples). Left out: kept on an"
            " update; a new policy is always in force.",
        ),
    ] = None
    no_windows: Annotated[
        bool,
        typer.Option("--no-windows", help="Remove the policy's windows: always in force again."),
    ] = False

    def body(self) -> dict[str, object]:
        """The fields given, as the API names them: a list of window objects replaces the
        policy's windows, null (``--no-windows``) removes them."""
        names = ("priority", "reserved", "limit", "description")
        fields = given_of(self, *names, priority_lane="lane")
        if self.window and self.no_windows:
            raise typer.BadParameter(
                "give --window or --no-windows, not both", param_hint="--window"
            )
        if self.window:
            fields["windows"] = parse_windows(self.window)
        elif self.no_windows:
            fields["windows"] = None
        return fields


def find_policy(api: Api, pool: str, subject: str) -> Policy | None:
    """The policy binding ``subject`` to ``pool`` (a pool ref), or None."""
    found = api.call("GET", "/v1/policies", list[Policy], params={"pool": pool, "subject": subject})
    return found[0] if found else None


@app.command("attach-policy")
def attach_policy(pool: PoolRef, subject: Subject, *, fields: PolicyFields, shown: Shown) -> None:
    """Bind a subject (or a pattern of subjects) to a pool, or update its existing policy there.

    A pattern policy ('team-vision:*') is one quota shared by every subject it covers: a
    request's policy is its subject's own, else the pattern with the longest text before its
    first *. Outside its windows a policy's reserved share is not in force: what its subjects
    hold there is borrowed. Options left out keep the policy's values on an update.

    Example:

        respool pool attach-policy training-gpus orchestrator:prod -p 10 -r '{"gpu": 4}'
        respool pool attach-policy training-gpus orchestrator:dev -l '{gpu: 8, step_run: 4}'
        respool pool attach-policy training-gpus 'team-vision:*' -r '{gpu: 2}' --lane
        respool pool attach-policy training-gpus orchestrator:prod \\
            --window 'mon-fri 09:00-17:00 Europe/Berlin' --window '22:00-06:00 UTC'
        respool pool attach-policy training-gpus orchestrator:prod \\
            --window 2026-12-24T00:00Z/2026-12-27T00:00Z
    """
    body = fields.body()
    with shown.api() as api:
        existing = find_policy(api, pool, subject)
        if existing is None:
            body = {"subject": subject, "pool": pool, **body}
            policy = api.call("POST", "/v1/policies", Policy, body=body)
            note(f"attached {subject} to pool {policy.pool}")
        else:
            policy = api.call("PATCH", f"/v1/policies/{existing.id}", Policy, body=body)
            note(f"updated the policy of {subject} on pool {policy.pool}")
    emit(policy, shown.output, lambda: [policies_table([policy])])


@app.command("detach-policy")
def detach_policy(
    pool: PoolRef, subject: Detached, yes: Yes = False, force: Force = False, *, remote: Remote
) -> None:
    """Remove a subject's policy from a pool (asks first unless --yes).

    Example:

        respool pool detach-policy training-gpus orchestrator:dev -y
    """
    with remote.api() as api:
        policy = find_policy(api, pool, subject)
        if policy is None:
            raise CliError(f"subject {subject} has no policy on pool {pool}")
        confirm(f"Detach {subject} from pool {policy.pool}?", yes=yes)
        api.call("DELETE", f"/v1/policies/{policy.id}", params={"force": str(force).lower()})
    note(f"detached {subject} from pool {policy.pool}")


@app.command("list-policies")
def list_policies(pool: OnlyPool = None, subject: OnlySubject = None, *, shown: Shown) -> None:
    """List policies with reserved, limit, used and borrowed units per key, their lane,
    windows, whether the reserved share is in force now (ACTIVE) and when that flips next
    (NEXT CHANGE, UTC), and for a pattern the subjects it covers now (COVERS).

    Example:

        respool pool list-policies training-gpus
        respool pool list-policies --subject orchestrator:prod -o json
    """
    with shown.api() as api:
        policies = api.call(
            "GET", "/v1/policies", list[Policy], params={"pool": pool, "subject": subject}
        )
    # One pool asked for: its name is in every row, so no POOL column (as kubectl -n).
    emit(policies, shown.output, lambda: [policies_table(policies, show_pool=pool is None)])
