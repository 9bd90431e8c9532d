"""Refused settlements (docs/rates.md, "Settling"): each kind of bad ``used`` is refused with its
code, the field it names and its sentence, whether the release comes alone or in a coalesced
batch beside a good one, and the refused release changes nothing."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from engine_support import mk_policy, mk_pool, mk_req, status

from app.db import requests as db_requests
from app.db.errors import BadInput, Conflict, EngineError

RATES = {
    "llm_tokens": {"amount": 10_000, "per_seconds": 60},
    "api_calls": {"amount": 100, "per_seconds": 60},
}
MAX_AMOUNT = 10**15


@pytest.fixture
async def llm(conn: asyncpg.Connection) -> asyncpg.Connection:
    """Pool llm: 4 GPUs and two budgets; subject a."""
    await mk_pool(conn, "llm", {"gpu": 4}, rates=RATES)
    await mk_policy(conn, "a", "llm")
    return conn


# (used, error class, field, the sentence as a pattern; {id}: the request's id)
CASES: list[tuple[Any, type[EngineError], str, str]] = [
    ({f"k{i}": 0 for i in range(65)}, BadInput, "used", r"used has more than 64 keys"),
    ({"Bad-Key": 1}, BadInput, "used.Bad-Key", r"used: bad resource key 'Bad-Key' \(expected .+\)"),
    ({"llm_tokens": 1.5}, BadInput, "used.llm_tokens",
     rf"used\.llm_tokens must be an integer between 0 and {MAX_AMOUNT}, got 1\.5"),
    ({"llm_tokens": -1}, BadInput, "used.llm_tokens",
     rf"used\.llm_tokens must be an integer between 0 and {MAX_AMOUNT}, got -1"),
    ({"gpu": 1}, BadInput, "used.gpu",
     r"used\.gpu: gpu is not a rate key of pool llm; only rate keys are settled"),
    ({"api_calls": 1}, BadInput, "used.api_calls",
     r"used\.api_calls: request {id} reserved no api_calls; settle only the rate keys it reserved"),
]  # fmt: skip


def _matches(err: object, kind: type[EngineError], field: str, sentence: str, rid: UUID) -> bool:
    return (
        isinstance(err, kind)
        and err.field == field
        and re.fullmatch(sentence.replace("{id}", str(rid)), err.message) is not None
    )


async def _alone(conn: asyncpg.Connection, rid: UUID, used: Any) -> object:
    try:
        return await db_requests.release_request(conn, rid, used=used)
    except EngineError as err:
        return err


async def _batched(conn: asyncpg.Connection, rid: UUID, used: Any) -> object:
    good = await mk_req(conn, "a", "llm", resources={"llm_tokens": 10})
    results = await db_requests.release_requests(
        conn, [(good.id, None, {"llm_tokens": 5}), (rid, None, used)]
    )
    assert getattr(results[0], "status", None) == "released"  # the good member is not held back
    return results[1]


Release = Callable[[asyncpg.Connection, UUID, Any], Awaitable[object]]


@pytest.fixture(params=[_alone, _batched], ids=["alone", "batched"])
def how(request: pytest.FixtureRequest) -> Release:
    """A release settling ``used``: alone, or in a coalesced batch after a good one."""
    return request.param


@pytest.mark.parametrize(("used", "kind", "field", "sentence"), CASES)
async def test_a_bad_settlement_is_refused_with_its_field_and_sentence(
    llm: asyncpg.Connection,
    how: Release,
    used: Any,
    kind: type[EngineError],
    field: str,
    sentence: str,
) -> None:
    r = await mk_req(llm, "a", "llm", resources={"gpu": 1, "llm_tokens": 4000})
    err = await how(llm, r.id, used)
    assert _matches(err, kind, field, sentence, r.id), err
    assert await status(llm, r.id) == "allocated"


async def test_a_request_never_granted_has_no_charge_to_settle(
    llm: asyncpg.Connection, how: Release
) -> None:
    hog = await mk_req(llm, "a", "llm", resources={"api_calls": 100})
    waiting = await mk_req(llm, "a", "llm", resources={"api_calls": 1})
    err = await how(llm, waiting.id, {"api_calls": 1})
    sentence = r"request {id} holds no charge to settle: it was never granted"
    assert _matches(err, Conflict, "used", sentence, waiting.id), err
    assert await status(llm, waiting.id) == "queued"
    assert await status(llm, hog.id) == "allocated"


async def test_a_settlement_given_again_with_another_amount_is_refused(
    llm: asyncpg.Connection, how: Release
) -> None:
    r = await mk_req(llm, "a", "llm", resources={"llm_tokens": 4000})
    await db_requests.release_request(llm, r.id, used={"llm_tokens": 100})
    err = await how(llm, r.id, {"llm_tokens": 200})
    sentence = r"used\.llm_tokens: the charge of request {id} was already settled at 100"
    assert _matches(err, Conflict, "used.llm_tokens", sentence, r.id), err
    assert (
        getattr(await how(llm, r.id, {"llm_tokens": 100}), "status", None) == "released"
    )  # same: a retry


async def test_a_settlement_that_is_not_an_object_is_refused_naming_used(
    llm: asyncpg.Connection,
) -> None:
    # (the API's decoding refuses it first; the engine refuses it too, without an error of its own)
    r = await mk_req(llm, "a", "llm", resources={"llm_tokens": 4000})
    rows = await llm.fetch(
        "SELECT * FROM respool._settle_refusals($1, ARRAY['[1]'::jsonb, '\"tokens\"'::jsonb])",
        [r.id, r.id],
    )
    assert [(x["member"], x["code"], x["field"]) for x in rows] == [
        (1, "RP400", "used"),
        (2, "RP400", "used"),
    ]
    assert rows[0]["message"] == "used must be an object of rate key: units used"
