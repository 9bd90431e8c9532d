"""Schemathesis fuzzes the running API against its own OpenAPI document (/schema/openapi.json).

Every check runs except ``positive_data_acceptance``: it expects every schema-valid body to be
accepted, but some of the engine's rules cannot be written in JSON Schema (a reserved key must be
tracked by the pool, ``reserved <= limit``, no ``step_run`` in a request, a reused idempotency
key, a cursor must come from this API) and integers written as ``2.0`` are refused on purpose
(docs/api.md, "Strict bodies"). Those answers are 4xx by design. Everything else must hold: no
5xx, every status code and body as documented, schema-invalid input refused with 4xx, ``Allow``
on 405 and ``OPTIONS``, deleted resources gone, created ones readable.

The run is bounded (``EXAMPLES`` per operation, a fixed seed) to stay well under a minute on two
cores; docs/api.md has the command for a longer run by hand.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from support.fuzz import schemathesis_on_a_server

pytestmark = pytest.mark.slow  # measured: tens of seconds (pytest --durations)

EXAMPLES = 12
SEED = 20261122


async def test_schemathesis_finds_nothing(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="respool")
    code, report = await schemathesis_on_a_server(
        db_url, tmp_path, examples=EXAMPLES, seed=SEED, within=240
    )
    assert code == 0, report[-8000:]

    selected = re.search(r"Selected: (\d+)/(\d+)", report)
    tested = re.search(r"Tested: (\d+)", report)
    cases = re.search(r"(\d+) generated, (\d+) passed", report)
    assert selected and tested and cases, report[-3000:]
    assert int(tested.group(1)) == int(selected.group(2)) >= 20, report[-3000:]  # every operation
    assert int(cases.group(1)) == int(cases.group(2)) >= 200, report[-3000:]
    # No handler failed unexpectedly (app.api.errors logs every 500 with its traceback).
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert failures == []
