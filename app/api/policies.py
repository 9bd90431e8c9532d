"""``/v1/policies``: bind subjects, or patterns with * (team quotas), to pools: priority, priority
lane, reserved share, hard limit and the windows in which the share is in force.

Every role reads every policy (a pool's configuration); a client token's answers list in a
pattern's ``covers`` only the subjects its globs cover (docs/api.md)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, get, patch, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery, QueryParameter
from respool_client.wire import Policy, PolicyCreate, PolicyUpdate

from app.api.auth import subject_reader
from app.api.common import AnyRequest, StrictBody, db, decode_body, delete_by_ref, sent
from app.api.errors import error_responses
from app.db import policies as db_policies


def visible_policy(request: AnyRequest, policy: Policy) -> Policy:
    """``policy`` as the caller may see it: ``covers`` keeps the subjects it may read."""
    may_read = subject_reader(request)
    covers = [s for s in policy.covers if may_read(s)]
    if len(covers) == len(policy.covers):
        return policy
    return msgspec.structs.replace(policy, covers=covers)


_READ_ERRORS = error_responses(400, 404)


class PolicyController(Controller):
    path = "/v1/policies"
    tags = ["policies"]

    @post("/", status_code=201, summary="Create a policy", responses=error_responses(400, 404, 409))
    async def create_policy(
        self, state: State, request: AnyRequest, data: StrictBody[PolicyCreate]
    ) -> Policy:
        body = await decode_body(request, PolicyCreate)
        return await db_policies.create_policy(db(state), **msgspec.structs.asdict(body))

    @get("/", summary="List policies with usage and borrowed units", responses=_READ_ERRORS)
    async def list_policies(
        self,
        state: State,
        request: AnyRequest,
        pool: FromQuery[str | None] = None,
        subject: FromQuery[str | None] = None,
    ) -> list[Policy]:
        found = await db_policies.list_policies(db(state), pool=pool, subject=subject)
        return [visible_policy(request, p) for p in found]

    @get("/{ref:str}", summary="One policy", responses=error_responses(400, 404))
    async def get_policy(self, state: State, request: AnyRequest, ref: FromPath[str]) -> Policy:
        return visible_policy(request, await db_policies.get_policy(db(state), ref))

    @patch("/{ref:str}", summary="Update a policy", responses=error_responses(400, 404, 409))
    async def update_policy(
        self,
        state: State,
        request: AnyRequest,
        ref: FromPath[str],
        data: StrictBody[PolicyUpdate],
    ) -> Policy:
        body = await decode_body(request, PolicyUpdate)
        return await db_policies.update_policy(db(state), ref, **sent(body))

    @delete_by_ref("policy")
    async def delete_policy(
        self, state: State, ref: FromPath[str], force: Annotated[bool, QueryParameter()] = False
    ) -> None:
        await db_policies.delete_policy(db(state), ref, force=force)
