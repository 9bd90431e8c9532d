"""Structured logs: JSON lines, and one ``respool.state`` line per state change made by this
process (app/logs.py)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.logs import JsonFormatter, StateChangeLog, configure_logging
from app.settings import Settings, SettingsError
from support.http import ok
from support.server import ServeProcess, running_server
from support.wait import wait_until


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def state_records() -> Iterator[list[logging.LogRecord]]:
    handler = _Collect()
    logger = logging.getLogger("respool.state")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_json_formatter_writes_one_object_per_line() -> None:
    record = logging.LogRecord("respool.x", logging.WARNING, __file__, 1, "a %s", ("b",), None)
    record.request_id = "r-1"
    record.subject = "team-a"
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "WARNING" and doc["logger"] == "respool.x" and doc["msg"] == "a b"
    assert doc["request_id"] == "r-1" and doc["subject"] == "team-a"
    assert doc["ts"].endswith("+00:00")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    doc = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in doc["exc"]


def test_configure_logging_json_routes_uvicorn_too() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("INFO", "json")
        (handler,) = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        stream = io.StringIO()
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(stream)
        logging.getLogger("uvicorn.error").info("started")
        doc = json.loads(stream.getvalue())
        assert doc["logger"] == "uvicorn.error" and doc["msg"] == "started"
        with pytest.raises(ValueError):
            configure_logging("INFO", "xml")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])


def test_log_format_setting() -> None:
    assert Settings.from_env({}).log_format == "text"
    assert Settings.from_env({"RESPOOL_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(SettingsError, match="RESPOOL_LOG_FORMAT"):
        Settings.from_env({"RESPOOL_LOG_FORMAT": "yaml"})


async def test_one_line_per_state_change_made_by_this_process(
    db_url: str, state_records: list[logging.LogRecord]
) -> None:
    async with running_server(db_url) as srv:
        c = srv.client
        assert (await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}})).is_success
        r = await c.post("/v1/policies", json={"subject": "team-a", "pool": "p"})
        assert r.is_success
        a = (
            await c.post("/v1/requests", json={"subject": "team-a", "resources": {"gpu": 1}})
        ).json()
        b = (
            await c.post("/v1/requests", json={"subject": "team-a", "resources": {"gpu": 1}})
        ).json()
        assert (a["status"], b["status"]) == ("allocated", "queued")
        await c.post(f"/v1/requests/{a['id']}/release")  # a released, b allocated
        await wait_until(lambda: len(state_records) >= 5, "five state-change lines", within=4)
        await asyncio.sleep(0.2)  # nothing more may come

        lines = [
            (r.request_id, r.from_status, r.status, r.subject, r.pool)  # type: ignore[attr-defined]
            for r in state_records
        ]
        assert sorted(lines, key=str) == sorted(
            [
                (a["id"], None, "queued", "team-a", "p"),
                (a["id"], "queued", "allocated", "team-a", "p"),
                (b["id"], None, "queued", "team-a", "p"),
                (a["id"], "allocated", "released", "team-a", "p"),
                (b["id"], "queued", "allocated", "team-a", "p"),
            ],
            key=str,
        )
        assert all(r.getMessage().startswith("request ") for r in state_records)

        # A change made by another session (psql, another process) is not logged here.
        state_records.clear()
        foreign = await asyncpg.connect(db_url)
        try:
            await foreign.execute("SELECT respool.release_request(p_id => $1::uuid)", b["id"])
        finally:
            await foreign.close()
        r = await c.get(f"/v1/requests/{b['id']}")
        assert r.json()["status"] == "released"
        await asyncio.sleep(0.3)
        assert state_records == []


async def test_state_change_log_uses_the_payload_when_it_has_the_subject(
    state_records: list[logging.LogRecord],
) -> None:
    log = StateChangeLog(own_pids=lambda: frozenset({42}))
    payload = json.dumps(
        {"id": "00000000-0000-0000-0000-000000000001", "status": "preempted", "version": 4,
         "pool": "gpus", "subject": "team-b", "from": "allocated", "reason": "reclaim",
         "attempt": 1}
    )  # fmt: skip
    log(7, payload)  # another process's backend: ignored
    log(42, payload)
    log(42, "not json")
    assert len(state_records) == 1
    rec = state_records[0]
    assert rec.subject == "team-b" and rec.reason == "reclaim"  # type: ignore[attr-defined]
    assert rec.from_status == "allocated" and rec.status == "preempted"  # type: ignore[attr-defined]
    assert "reason reclaim" in rec.getMessage()


@pytest.mark.parametrize("level", ["INFO", "WARNING"])
async def test_serve_writes_its_state_lines_in_the_format_and_level_set(
    db_url: str, tmp_path: Path, level: str
) -> None:
    """``respool serve`` with ``RESPOOL_LOG_FORMAT=json``: every line it writes is one JSON object,
    and its state-change lines (level INFO) are there only when ``RESPOOL_LOG_LEVEL`` lets INFO
    through."""
    serve = ServeProcess(db_url, tmp_path, RESPOOL_LOG_FORMAT="json", RESPOOL_LOG_LEVEL=level)
    serve.start()
    try:
        await serve.ready()
        async with httpx.AsyncClient(base_url=serve.url, timeout=30) as c:
            ok(await c.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
            ok(await c.post("/v1/policies", json={"subject": "team-a", "pool": "p"}), 201)
            body = {"subject": "team-a", "pool": "p", "resources": {"gpu": 1}}
            made = ok(await c.post("/v1/requests", json=body), 201)
            ok(await c.post(f"/v1/requests/{made['id']}/release"))

            def released_logged() -> bool:
                return any(
                    '"state_change"' in line and '"released"' in line
                    for line in serve.log(200_000).splitlines()
                )

            if level == "INFO":
                await wait_until(released_logged, "the release's state line", within=10)
    finally:
        serve.close()
    lines = [line for line in serve.log(200_000).splitlines() if line.startswith("{")]
    docs = [json.loads(line) for line in lines]
    assert docs and all({"ts", "level", "logger", "msg"} <= set(d) for d in docs)
    states = [d for d in docs if d["logger"] == "respool.state"]
    if level == "INFO":
        assert [d["status"] for d in states] == ["queued", "allocated", "released"]
    else:
        assert states == [] and all(d["level"] != "INFO" for d in docs)
