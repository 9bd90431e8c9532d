"""``/v1/pools``: create, list, read, update (capacity merge) and delete pools."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, get, patch, post
from litestar.datastructures import State
from litestar.params import FromPath, QueryParameter
from respool_client.wire import Pool, PoolCreate, PoolUpdate

from app.api.common import AnyRequest, StrictBody, db, decode_body, delete_by_ref, sent
from app.api.errors import error_responses
from app.db import pools as db_pools


class PoolController(Controller):
    path = "/v1/pools"
    tags = ["pools"]

    @post("/", status_code=201, summary="Create a pool", responses=error_responses(400, 409))
    async def create_pool(
        self, state: State, request: AnyRequest, data: StrictBody[PoolCreate]
    ) -> Pool:
        body = await decode_body(request, PoolCreate)
        return await db_pools.create_pool(db(state), **msgspec.structs.asdict(body))

    @get("/", summary="List pools with usage and queued count", responses=error_responses())
    async def list_pools(self, state: State) -> list[Pool]:
        return await db_pools.list_pools(db(state))

    @get(
        "/{ref:str}",
        summary="One pool (name, id or unique id prefix)",
        responses=error_responses(400, 404),
    )
    async def get_pool(self, state: State, ref: FromPath[str]) -> Pool:
        return await db_pools.get_pool(db(state), ref)

    @patch(
        "/{ref:str}",
        summary="Update a pool (capacity merges; 0 removes a key)",
        responses=error_responses(400, 404, 409),
    )
    async def update_pool(
        self, state: State, request: AnyRequest, ref: FromPath[str], data: StrictBody[PoolUpdate]
    ) -> Pool:
        body = await decode_body(request, PoolUpdate)
        fields = sent(body)
        starvation_off = "starvation_seconds" in fields and fields["starvation_seconds"] is None
        return await db_pools.update_pool(db(state), ref, starvation_off=starvation_off, **fields)

    @delete_by_ref("pool")
    async def delete_pool(
        self, state: State, ref: FromPath[str], force: Annotated[bool, QueryParameter()] = False
    ) -> None:
        await db_pools.delete_pool(db(state), ref, force=force)
