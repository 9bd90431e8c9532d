"""The dashboard: ``/`` and its assets, ``GET /v1/dashboard``, and the page rendered by headless
Chromium against a live server (pools, queue with labels and ETA, events with UTC times, a
screenshot saved; with auth on, the token prompt and a rejected token, driven over the
DevTools protocol; a running job's output tail from a real agent, shown as text).

Set ``RESPOOL_UPDATE_SCREENSHOT=1`` to also write the screenshot to docs/img/dashboard.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from app.db import tokens
from app.db.connect import APP_CLI, connect
from support.db import direct
from support.proc import stop
from support.server import Server, respool_command, running_server
from support.wait import first_true

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
Test = TypeVar("Test", bound=Callable[..., Any])
needs_chromium = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"{CHROMIUM} not found: install Debian's chromium package (.ci/run does)",
)


def in_chromium(test: Test) -> Test:
    """A test in a headless browser: slow, and skipped without one."""
    return needs_chromium(pytest.mark.slow(test))


HISTORY = 20  # finished holds recorded in cpu-batch (licences has none)


def _caller(srv: Server) -> Callable[..., Awaitable[Any]]:
    """``ok(method, url, **body)``: that call to ``srv`` with ``body`` as JSON, asserted a success;
    its JSON answer (None: an empty one)."""

    async def ok(method: str, url: str, **body: Any) -> Any:
        r = await srv.client.request(method, url, json=body or None)
        assert r.is_success, r.text
        return r.json() if r.content else None

    return ok


async def _dashboard_data(srv: Server) -> Any:
    """``GET /v1/dashboard``'s JSON."""
    return (await srv.client.get("/v1/dashboard")).json()


async def showcase(srv: Server, conn: asyncpg.Connection) -> dict[str, Any]:
    """A small production-like picture: borrowing, a reclaim preemption, a queue."""
    ok = _caller(srv)
    await ok("POST", "/v1/pools", name="a100", capacity={"gpu": 8, "mcpu": 64000},
             description="8x A100 node pool")  # fmt: skip
    await ok("POST", "/v1/pools", name="cpu-batch", capacity={"mcpu": 32000, "memory_mb": 128000})
    await ok("POST", "/v1/pools", name="licences", capacity={"licence_x": 3}, queueing="strict")
    await ok("POST", "/v1/policies", subject="orchestrator:prod", pool="a100", priority=10,
             reserved={"gpu": 4, "mcpu": 16000})  # fmt: skip
    await ok("POST", "/v1/policies", subject="research:alice", pool="a100", limit={"gpu": 8})
    await ok("POST", "/v1/policies", subject="research:bob", pool="a100", limit={"gpu": 4})
    await ok("POST", "/v1/policies", subject="ci:nightly", pool="cpu-batch",
             reserved={"mcpu": 16000})  # fmt: skip
    await ok("POST", "/v1/policies", subject="research:alice", pool="licences")
    await ok("POST", "/v1/policies", subject="ci:nightly", pool="licences")

    def req(subject: str, pool: str, **res: int) -> Any:
        return ok("POST", "/v1/requests", subject=subject, pool=pool, resources=res,
                  labels={"run": "demo", "step": f"{subject.split(':')[1]}-{pool}"})  # fmt: skip

    for _ in range(3):
        await req("ci:nightly", "cpu-batch", mcpu=8000, memory_mb=16000)
    await req("ci:nightly", "cpu-batch", mcpu=12000, memory_mb=32000)  # waits for mcpu
    await req("research:alice", "licences", licence_x=2)
    await req("ci:nightly", "licences", licence_x=2)  # strict queue head
    for _ in range(HISTORY):  # finished holds in cpu-batch: what its ETA goes by
        done = await req("ci:nightly", "cpu-batch", mcpu=1000)
        assert done["status"] == "allocated", done
        await ok("POST", f"/v1/requests/{done['id']}/release")
    alice = await req("research:alice", "a100", gpu=6, mcpu=8000)  # borrows 6 GPUs
    await req("research:bob", "a100", gpu=2, mcpu=4000)  # borrows the last 2
    prod = await req("orchestrator:prod", "a100", gpu=4, mcpu=8000)  # in share, queued
    assert (alice["status"], prod["status"]) == ("allocated", "queued")
    pool_id = await conn.fetchval("SELECT id FROM respool.pools WHERE name = 'a100'")
    await conn.execute("SELECT respool.reconcile_pool(p_pool_id => $1)", pool_id)  # reclaim
    await req("research:alice", "a100", gpu=4)  # waits: pool full
    await req("research:bob", "a100", gpu=3)  # waits: pool full, behind alice
    return {"alice": alice, "prod": prod}


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Server]:
    async with direct(db_url) as conn, running_server(db_url) as srv:
        await showcase(srv, conn)
        yield srv


async def test_page_and_assets(live: Server) -> None:
    c = live.client
    r = await c.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script src="/dashboard/app.js">' in r.text
    r = await c.get("/dashboard/app.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert (await c.get("/dashboard/style.css")).headers["content-type"].startswith("text/css")
    assert (await c.get("/dashboard/../../settings.py")).status_code == 404
    assert (await c.get("/dashboard/secrets.txt")).status_code == 404


async def test_dashboard_data(live: Server) -> None:
    data = await _dashboard_data(live)
    pools = {p["name"]: p for p in data["pools"]}
    assert set(pools) == {"a100", "cpu-batch", "licences"}
    gpu = next(k for k in pools["a100"]["keys"] if k["key"] == "gpu")
    # prod 4 (in share) + bob 2 (borrowed); alice's 6 were reclaimed
    assert (gpu["capacity"], gpu["allocated"], gpu["reserved"], gpu["borrowed"]) == (8, 6, 4, 2)
    assert gpu["queued_demand"] == 7
    queue = [(q["pool"], q["position"], q["subject"], q["waiting_for"]) for q in data["queue"]]
    assert queue == [
        ("a100", 1, "research:alice", "waiting for gpu: pool 6/8 used, needs 4"),
        ("a100", 2, "research:bob", "waiting for gpu: pool 6/8 used, needs 3"),
        ("cpu-batch", 1, "ci:nightly", "waiting for mcpu: pool 24000/32000 used, needs 12000"),
        ("licences", 1, "ci:nightly", "waiting for licence_x: pool 2/3 used, needs 2"),
    ]
    changes = [(e["subject"], e["to_status"], e["reason"]) for e in data["events"]]
    assert ("research:alice", "preempted", "reclaim") in changes
    assert data["violations"] == []
    assert {h["subject"] for h in data["holdings"]} == {
        "orchestrator:prod", "research:bob", "ci:nightly", "research:alice",
    }  # fmt: skip


async def test_queue_rows_carry_the_engines_eta(live: Server) -> None:
    data = await _dashboard_data(live)
    eta = {(q["pool"], q["position"]): q["eta"] for q in data["queue"]}
    # cpu-batch has finished holds to go by: its waiting request has an estimate.
    cpu = eta[("cpu-batch", 1)]
    assert cpu is not None and set(cpu) == {"p50_seconds", "p90_seconds"}, cpu
    assert all(isinstance(v, int) for v in cpu.values())
    assert 0 <= cpu["p50_seconds"] <= cpu["p90_seconds"]
    # Nothing has ever finished holding in licences: no estimate, and the field says so.
    assert eta[("licences", 1)] is None
    # Labels travel with queue rows and holdings (the page shows them).
    assert all(q["labels"]["run"] == "demo" for q in data["queue"])
    assert all(h["labels"]["run"] == "demo" for h in data["holdings"])


async def test_dashboard_under_auth(db_url: str) -> None:
    async with direct(db_url) as conn:
        reader, _ = await tokens.create_token(conn, name="wall", role="reader")
        client, _ = await tokens.create_token(
            conn, name="ci", role="client", subject_patterns=["ci:*"]
        )
    async with running_server(db_url, auth="on", admin_token="adm") as srv:
        c = srv.client
        assert (await c.get("/")).status_code == 200  # the page holds no data
        assert (await c.get("/dashboard/app.js")).status_code == 200
        assert (await c.get("/v1/dashboard")).status_code == 401
        auth = {"Authorization": f"Bearer {reader}"}
        assert (await c.get("/v1/dashboard", headers=auth)).status_code == 200
        r = await c.get("/v1/dashboard", headers={"Authorization": f"Bearer {client}"})
        assert r.status_code == 403 and "reader token" in r.json()["detail"]


def _text(html: str) -> str:
    """The text of an HTML fragment (tags dropped, spaces squeezed)."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


async def _chromium(profile: Path, *args: str) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out


async def _dashboard_dom(srv: Server, tmp_path: Path) -> str:
    """The dashboard's DOM once its script has drawn it (asserted: ``data-ready``)."""
    dom = (
        await _chromium(tmp_path / "dom", "--virtual-time-budget=5000", "--dump-dom", srv.url + "/")
    ).decode()
    assert 'data-ready="1"' in dom, dom[:2000]
    return dom


@in_chromium
async def test_chromium_renders_pools_queue_and_events(live: Server, tmp_path: Path) -> None:
    dom = await _dashboard_dom(live, tmp_path)
    for pool in ("a100", "cpu-batch", "licences"):
        assert f'data-pool="{pool}"' in dom, pool
    assert re.search(r"<b>gpu</b>\s*6 / 8", dom)
    assert "waiting for gpu: pool 6/8 used, needs 4" in dom
    assert "waiting for licence_x: pool 2/3 used, needs 2" in dom
    assert dom.count("data-request=") == 4  # four queue rows
    assert "reclaim" in dom and "preempted" in dom
    assert 'id="status" class="status" data-state="live"' in dom
    assert "No pools yet." not in dom

    # The ETA column shows the engine's estimate where it has one, "—" where it has none.
    row = r'<tr data-request="[^"]+" data-queue-pool="([^"]+)">(.*?)</tr>'
    rows = dict(re.findall(row, dom, re.S))
    eta_cpu = re.search(r'<td class="eta" title="([^"]*)">(.*?)</td>', rows["cpu-batch"])
    assert eta_cpu is not None, rows["cpu-batch"]
    assert re.fullmatch(r"~\d+[smhd].*90% ≤ \d+[smhd].*", _text(eta_cpu.group(2))), eta_cpu.group(0)
    assert "90%: within" in eta_cpu.group(1)
    eta_lic = re.search(r'<td class="eta" title="([^"]*)">(.*?)</td>', rows["licences"])
    assert eta_lic is not None and _text(eta_lic.group(2)) == "—"
    assert "no estimate yet" in eta_lic.group(1)
    # Labels as k=v chips, on queue rows and holdings.
    assert '<span class="chip">run=demo</span>' in rows["licences"]
    assert '<span class="chip">step=nightly-licences</span>' in rows["licences"]
    holdings = dom.split('id="holdings"')[1].split("</table>")[0]
    assert holdings.count('<span class="chip">run=demo</span>') == holdings.count("<tr>") - 1
    # Times in UTC ISO 8601 like the CLI, whole seconds, not in the browser's 12-hour clock.
    events = dom.split('id="events"')[1].split("</table>")[0]
    times = re.findall(r'<td class="time mono" title="[^"]*">([^<]*)</td>', events)
    assert times and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", t) for t in times)
    assert not re.search(r"\d:\d\d(:\d\d)? ?[AP]M", dom)
    assert re.search(r'data-state="live">live · \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ<', dom)
    # Policies list no key a subject neither holds nor has a reservation or limit on.
    policies = " ".join(re.findall(r'<div class="pool".*?</table>', dom, re.S))
    assert not re.search(r"\b(mcpu|memory_mb|gpu|licence_x) 0(;|<)", policies), policies

    shot = tmp_path / "dashboard.png"
    await _chromium(
        tmp_path / "shot",
        "--virtual-time-budget=5000",
        "--window-size=1440,1250",
        f"--screenshot={shot}",
        live.url + "/",
    )
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000
    if os.environ.get("RESPOOL_UPDATE_SCREENSHOT"):
        DOCS_SHOT.parent.mkdir(parents=True, exist_ok=True)
        DOCS_SHOT.write_bytes(data)


# --- a pool backed by nodes: one cell per device, coloured by its holder ----------------------

UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000" for i in range(4)]


async def node_showcase(srv: Server) -> dict[str, Any]:
    """Pool h100 backed by two nodes (8 GPUs "0".."7" with anonymous mcpu; 4 GPUs by UUID),
    three holders, and the abstract pool cpu-batch beside it."""
    ok = _caller(srv)
    await ok("POST", "/v1/pools", name="h100", capacity={})
    await ok("POST", "/v1/pools", name="cpu-batch", capacity={"mcpu": 32000})
    eight = [str(i) for i in range(8)]
    await ok("POST", "/v1/nodes", name="box-1", pool="h100", labels={"gpu-type": "H100-80G"},
             capacity={"gpu": 8, "mcpu": 64000}, devices={"gpu": eight})  # fmt: skip
    await ok("POST", "/v1/nodes", name="box-2", pool="h100", labels={"gpu-type": "H100-80G"},
             capacity={"gpu": 4}, devices={"gpu": UUIDS})  # fmt: skip
    await ok("POST", "/v1/nodes", name="spare", capacity={"gpu": 1})  # in no pool: not drawn
    for subject in ("research:alice", "research:bob"):
        await ok("POST", "/v1/policies", subject=subject, pool="h100")
    await ok("POST", "/v1/policies", subject="ci:nightly", pool="cpu-batch")
    held = [
        await ok("POST", "/v1/requests", subject="research:alice", pool="h100",
                 resources={"gpu": 3, "mcpu": 8000}),
        await ok("POST", "/v1/requests", subject="research:bob", pool="h100",
                 node_selector={"node": "box-1"}, resources={"gpu": 2}),
        await ok("POST", "/v1/requests", subject="research:bob", pool="h100",
                 node_selector={"node": "box-2"}, resources={"gpu": 1}),
    ]  # fmt: skip
    await ok("POST", "/v1/requests", subject="ci:nightly", pool="cpu-batch",
             resources={"mcpu": 1000})  # fmt: skip
    for r in held:
        assert r["status"] == "allocated" and r["placement"] is not None, r
    return {r["id"]: r for r in held}


@pytest.fixture
async def node_live(db_url: str) -> AsyncIterator[tuple[Server, dict[str, Any]]]:
    async with running_server(db_url) as srv:
        held = await node_showcase(srv)
        yield srv, held


def _expected_cells(held: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(node, device) → holder request id, from the requests' own placement."""
    out: dict[tuple[str, str], str] = {}
    for rid, r in held.items():
        for device in r["placement"]["devices"].get("gpu", []):
            out[(r["placement"]["node"], device)] = rid
    return out


async def test_dashboard_data_has_each_pools_nodes(
    node_live: tuple[Server, dict[str, Any]],
) -> None:
    srv, held = node_live
    data = await _dashboard_data(srv)
    pools = {p["name"]: p for p in data["pools"]}
    assert pools["cpu-batch"]["nodes"] == []  # abstract units: as before
    nodes = {n["name"]: n for n in pools["h100"]["nodes"]}
    assert set(nodes) == {"box-1", "box-2"}  # "spare" is in no pool
    box1 = nodes["box-1"]
    assert box1["state"] == "active" and box1["labels"] == {"gpu-type": "H100-80G"}
    keys = {k["key"]: k for k in box1["keys"]}
    assert keys["gpu"]["capacity"] == 8 and keys["gpu"]["named"] is True
    assert keys["mcpu"]["capacity"] == 64000 and keys["mcpu"]["named"] is False
    assert [d["device"] for d in box1["devices"]] == [str(i) for i in range(8)]  # list order
    assert [d["device"] for d in nodes["box-2"]["devices"]] == UUIDS
    cells = {
        (n, d["device"]): d["request_id"] for n, node in nodes.items() for d in node["devices"]
    }
    assert {k: v for k, v in cells.items() if v} == _expected_cells(held)
    for node in nodes.values():
        used = sum(1 for d in node["devices"] if d["request_id"])
        assert next(k for k in node["keys"] if k["key"] == "gpu")["used"] == used
        for d in node["devices"]:
            if d["request_id"]:
                assert d["subject"] == held[d["request_id"]]["subject"]
            else:
                assert d["subject"] is None


@in_chromium
async def test_chromium_draws_one_cell_per_device_coloured_by_holder(
    node_live: tuple[Server, dict[str, Any]], tmp_path: Path
) -> None:
    srv, held = node_live
    dom = await _dashboard_dom(srv, tmp_path)
    assert 'data-node="box-1"' in dom and 'data-node="box-2"' in dom
    assert 'data-node="spare"' not in dom
    cells = re.findall(r'<div class="cell(?: held)?" data-device="([^"]+)"([^>]*)>', dom)
    assert len(cells) == 8 + 4  # one cell per device of the pool's nodes
    expected = {device: rid for (_, device), rid in _expected_cells(held).items()}
    drawn = {}
    colours: dict[str, set[str]] = {}
    for device, rest in cells:
        holder = re.search(r'data-holder="([^"]+)"', rest)
        if holder is None:
            assert "free" in rest and "background" not in rest
            continue
        rid = drawn[device] = holder.group(1)
        # The title names the holder (subject and request id); the colour is the holder's.
        assert held[rid]["subject"] in rest and rid[:8] in rest
        colour = re.search(r"background:\s*(hsl\([^)]*\)|rgb\([^)]*\))", rest)
        assert colour is not None, rest
        colours.setdefault(rid, set()).add(colour.group(1))
    assert drawn == expected
    # A stable colour per holder: the same on each of its cells.
    assert all(len(c) == 1 for c in colours.values()) and len(colours) == len(held)
    # The pool without nodes is drawn as before: no node list in its card.
    abstract_card = dom.split('data-pool="cpu-batch"')[1].split('data-pool="h100"')[0]
    assert 'class="nodes"' not in abstract_card and 'class="cell' not in abstract_card
    await _chromium(
        tmp_path / "shot", "--virtual-time-budget=5000", "--window-size=1440,900",
        f"--screenshot={tmp_path / 'nodes.png'}", srv.url + "/",
    )  # fmt: skip
    assert (tmp_path / "nodes.png").read_bytes().startswith(b"\x89PNG")


# --- a shared device: its slices, sized by memory and coloured by holder -----------------------


@pytest.fixture
async def shared_live(db_url: str) -> AsyncIterator[tuple[Server, dict[str, Any]]]:
    """Pool nb backed by node nb-1 (gpus 0..2 shared under mps, 81920 MiB each, 512 kept back):
    two slices packed on one device, one request holding another device whole."""
    async with running_server(db_url) as srv:
        ok = _caller(srv)
        await ok("POST", "/v1/pools", name="nb", capacity={})
        await ok("POST", "/v1/nodes", name="nb-1", pool="nb", devices={"gpu": ["0", "1", "2"]},
                 sharing={"gpu": "mps"}, device_memory_mb={"gpu": 81920},
                 reserved_memory_mb={"gpu": 512})  # fmt: skip
        for subject in ("team:a", "team:b", "team:w"):
            await ok("POST", "/v1/policies", subject=subject, pool="nb")
        held = {
            "a": await ok("POST", "/v1/requests", subject="team:a", pool="nb",
                          resources={"gpu_memory_mb": 40960, "gpu_share": 50}),
            "b": await ok("POST", "/v1/requests", subject="team:b", pool="nb",
                          resources={"gpu_memory_mb": 20480}),
            "w": await ok("POST", "/v1/requests", subject="team:w", pool="nb",
                          resources={"gpu": 1}),
        }  # fmt: skip
        for r in held.values():
            assert r["status"] == "allocated", r
        yield srv, held


async def test_dashboard_data_has_each_shared_devices_slices(
    shared_live: tuple[Server, dict[str, Any]],
) -> None:
    srv, held = shared_live
    data = await _dashboard_data(srv)
    (node,) = next(p for p in data["pools"] if p["name"] == "nb")["nodes"]
    devices = {d["device"]: d for d in node["devices"]}
    sliced = held["a"]["placement"]["devices"]["gpu"][0]
    assert held["b"]["placement"]["devices"]["gpu"] == [sliced]  # pack: one device
    whole = held["w"]["placement"]["devices"]["gpu"][0]
    for d in devices.values():
        assert d["key"] == "gpu" and d["sharing"] == "mps" and d["memory_mb"] == 81408
    # the slices, largest first, each with its holder, memory and share (null: none asked)
    assert devices[sliced]["request_id"] is None
    assert devices[sliced]["slices"] == [
        {"request_id": held["a"]["id"], "subject": "team:a", "memory_mb": 40960, "share": 50},
        {"request_id": held["b"]["id"], "subject": "team:b", "memory_mb": 20480, "share": None},
    ]
    # a device held whole has its holder and no slices; a free one neither
    assert devices[whole]["request_id"] == held["w"]["id"] and devices[whole]["slices"] == []
    (spare,) = set(devices) - {sliced, whole}
    assert devices[spare]["request_id"] is None and devices[spare]["slices"] == []
    keys = {k["key"]: k for k in node["keys"]}
    assert keys["gpu_memory_mb"] == {
        "key": "gpu_memory_mb", "capacity": 3 * 81408, "used": 40960 + 20480 + 81408,
        "named": False,
    }  # fmt: skip


@in_chromium
async def test_chromium_draws_a_shared_devices_slices(
    shared_live: tuple[Server, dict[str, Any]], tmp_path: Path
) -> None:
    srv, held = shared_live
    dom = await _dashboard_dom(srv, tmp_path)

    def parts(device: str) -> list[tuple[str, float]]:
        """The cell of ``device``: each part's holder and width in percent."""
        cell = dom.split(f'data-device="{device}"')[1].split('class="cell')[0]
        found = re.findall(r'class="slice" data-holder="([^"]+)" style="width:\s*([0-9.]+)%', cell)
        return [(rid, round(float(width), 1)) for rid, width in found]

    sliced = held["a"]["placement"]["devices"]["gpu"][0]
    assert parts(sliced) == [
        (held["a"]["id"], round(100 * 40960 / 81408, 1)),
        (held["b"]["id"], round(100 * 20480 / 81408, 1)),
    ]
    assert parts(held["w"]["placement"]["devices"]["gpu"][0]) == [(held["w"]["id"], 100.0)]
    assert dom.count('data-sharing="mps"') == 3
    # the legend names every holder, of a slice or of a whole device
    for r in held.values():
        assert f'class="holder" data-holder="{r["id"]}"' in dom


# --- auth on: a prompt for a token, never an empty dashboard -----------------------------------


@pytest.fixture
async def guarded(db_url: str) -> AsyncIterator[tuple[Server, str]]:
    """A server with auth on, one pool, and a reader token."""
    async with direct(db_url) as conn:
        reader, _ = await tokens.create_token(conn, name="wall", role="reader")
    async with running_server(db_url, auth="on", admin_token="adm") as srv:
        r = await srv.client.post(
            "/v1/pools",
            json={"name": "gpus", "capacity": {"gpu": 4}},
            headers={"Authorization": "Bearer adm"},
        )
        assert r.is_success, r.text
        yield srv, reader


@in_chromium
async def test_chromium_without_a_token_asks_for_one(
    guarded: tuple[Server, str], tmp_path: Path
) -> None:
    srv, _ = guarded
    dom = await _dashboard_dom(srv, tmp_path)
    assert 'data-auth="needed"' in dom
    assert '<section id="locked" class="locked" data-state="needed">' in dom  # shown
    assert '<h2 id="locked-title">Token needed</h2>' in dom
    assert "This respool requires a token." in dom
    assert '<div id="data" hidden="">' in dom  # no empty tables, no "No pools yet."
    assert "No pools yet." not in dom and "Nothing is waiting." not in dom
    assert 'data-state="error">token needed<' in dom
    shot = tmp_path / "locked.png"
    await _chromium(
        tmp_path / "shot", "--virtual-time-budget=5000", "--window-size=1200,500",
        f"--screenshot={shot}", srv.url + "/",
    )  # fmt: skip
    assert shot.read_bytes().startswith(b"\x89PNG")


class ContextGone(Exception):
    """The page's JS context went away under a command (a navigation)."""


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    it reads JSON commands from fd 3 and writes replies and events to fd 4, each ending in NUL)."""

    def __init__(self, proc: asyncio.subprocess.Process, reader: asyncio.StreamReader, wfd: int):
        self.proc, self.reader, self.wfd = proc, reader, wfd
        self.last_id = 0
        self.session: str | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, profile: Path) -> AsyncIterator[DevTools]:
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        log_path = profile.parent / "chromium.log"  # its stderr, for a failure's message
        log = log_path.open("wb")
        proc = await asyncio.create_subprocess_exec(
            # bash, not sh: dash takes single-digit fds only in redirections
            "bash", "-c", f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', "bash",
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--remote-debugging-pipe",
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=asyncio.subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        log.close()
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        reader = asyncio.StreamReader(limit=1 << 24)
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_chrome_r, "rb", 0)
        )
        try:
            yield cls(proc, reader, to_chrome_w)
        except (BrokenPipeError, asyncio.IncompleteReadError) as exc:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise AssertionError(f"chromium went away: {exc!r}\n{tail}") from exc
        finally:
            transport.close()
            os.close(to_chrome_w)  # Chromium exits when its command pipe closes
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def call(self, method: str, **params: Any) -> Any:
        """Send one command; its result (events in between are skipped)."""
        self.last_id += 1
        msg: dict[str, Any] = {"id": self.last_id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        while True:
            reply = json.loads((await asyncio.wait_for(self.reader.readuntil(b"\0"), 30))[:-1])
            if reply.get("id") == self.last_id:
                error = reply.get("error")
                if error and re.search(
                    r"context was destroyed|Cannot find context", error.get("message", "")
                ):
                    raise ContextGone(error["message"])
                assert error is None, (method, error)
                return reply["result"]

    async def goto(self, url: str) -> None:
        """Open ``url`` in a new tab; return once its document is the page's (loaded or not)."""
        target = await self.call("Target.createTarget", url="about:blank")
        attached = await self.call(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        self.session = attached["sessionId"]
        await self.call("Page.navigate", url=url)
        await self.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState !== 'loading'"
        )

    async def js(self, expression: str) -> Any:
        out = await self.call(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        assert "exceptionDetails" not in out, out["exceptionDetails"]
        return out["result"].get("value")

    async def wait_for(self, condition: str) -> Any:
        """The value of a JS expression once it is truthy (polled in the page; fails after 20 s).
        A navigation under way replaces the page's JS context: then it asks again."""
        for _ in range(100):
            try:
                return await self._wait_for(condition)
            except ContextGone:
                await asyncio.sleep(0.05)
        raise AssertionError(f"the page kept navigating while waiting for {condition}")

    async def _wait_for(self, condition: str) -> Any:
        return await self.js(
            "new Promise((ok, fail) => { const t0 = Date.now(); (function tick() {"
            f" const v = ({condition}); if (v) ok(v);"
            " else if (Date.now() - t0 > 20000)"
            f" fail(new Error('timed out: ' + {json.dumps(condition)}));"
            " else setTimeout(tick, 50); })(); })"
        )

    async def submit_token(self, token: str) -> None:
        await self.js(
            f"document.getElementById('token').value = {json.dumps(token)};"
            " document.getElementById('auth').requestSubmit(); true"
        )


def _screen(dt: DevTools) -> Any:
    """What a user sees now: the prompt (title, text, server's word, status) or the pools."""
    return dt.js(
        "({auth: document.body.dataset.auth || null,"
        " title: document.getElementById('locked').hidden ? null"
        " : document.getElementById('locked-title').textContent,"
        " text: document.getElementById('locked-text').textContent,"
        " detail: document.getElementById('locked-detail').textContent,"
        " status: document.getElementById('status').textContent,"
        " data_shown: !document.getElementById('data').hidden,"
        " pools: [...document.querySelectorAll('[data-pool]')].map((e) => e.dataset.pool)})"
    )


@in_chromium
async def test_chromium_token_prompt_rejected_then_accepted(
    guarded: tuple[Server, str], tmp_path: Path
) -> None:
    srv, reader = guarded
    async with DevTools.open(tmp_path / "profile") as dt:
        await dt.goto(srv.url + "/")
        await dt.wait_for("document.body.dataset.auth === 'needed'")
        first = await _screen(dt)
        assert first["title"] == "Token needed" and not first["data_shown"], first

        await dt.submit_token("rp_not-a-real-token")
        await dt.wait_for("document.body.dataset.auth === 'rejected'")
        rejected = await _screen(dt)
        assert rejected["title"] == "Token rejected", rejected
        assert rejected["text"].startswith("The server did not accept the token given.")
        assert rejected["detail"].startswith("Server said: ")
        assert rejected["status"] == "token rejected"
        assert not rejected["data_shown"] and rejected["pools"] == []

        await dt.submit_token(reader)
        await dt.wait_for("!document.body.dataset.auth && document.querySelector('[data-pool]')")
        accepted = await _screen(dt)
        assert accepted["title"] is None and accepted["data_shown"], accepted
        assert accepted["pools"] == ["gpus"] and accepted["status"].startswith("live · ")


# --- running jobs: the tail of each one's output -------------------------------------------------

JOBS_ADMIN = "test-admin-token-dashboard-jobs-01234567"
# A job that prints 30 lines, a line of HTML on stderr and DONE, then MORE once told to (the file
# argv[1] exists), then runs on until stopped.
PRINTER = """\
import os, sys, time
for i in range(1, 31):
    print(f"line {i}", flush=True)
time.sleep(0.3)
print("<b>bold</b> & <script>alert(1)</script>", file=sys.stderr, flush=True)
time.sleep(0.3)
print("DONE", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("MORE", flush=True)
time.sleep(600)
"""
HTML_LINE = "<b>bold</b> & <script>alert(1)</script>"


@dataclass
class RunningJob:
    srv: Server
    admin: dict[str, str]
    request_id: str
    go: Path  # create it and the job prints MORE


@pytest.fixture
async def running_job(db_url: str, tmp_path: Path) -> AsyncIterator[RunningJob]:
    """A real agent (``respool agent``) of node n1 running :data:`PRINTER` as a job; yielded
    once the job printed DONE."""
    conn = await connect(db_url, application_name=APP_CLI)
    try:
        async with running_server(
            db_url, auth="on", admin_token=JOBS_ADMIN, with_reconciler=True,
            reconcile_interval=0.2,
        ) as srv:  # fmt: skip
            admin = {"Authorization": f"Bearer {JOBS_ADMIN}"}
            c = srv.client
            for path, body in (
                ("/v1/pools", {"name": "gpus"}),
                ("/v1/nodes", {"name": "n1", "pool": "gpus", "devices": {"gpu": ["0", "1"]}}),
                ("/v1/policies", {"subject": "team:train", "pool": "gpus"}),
            ):
                r = await c.post(path, headers=admin, json=body)
                assert r.status_code == 201, r.text
            agent_token, _ = await tokens.create_token(conn, name="a-n1", role="agent", node="n1")
            (tmp_path / "printer.py").write_text(PRINTER)
            go = tmp_path / "go"
            job = {
                "name": "printer",
                "command": [sys.executable, str(tmp_path / "printer.py"), str(go)],
            }
            body = {"subject": "team:train", "pool": "gpus", "resources": {"gpu": 1}, "job": job}
            r = await c.post("/v1/requests", headers=admin, json=body)
            assert r.status_code == 201, r.text
            rid = r.json()["id"]
            env = {**os.environ, "RESPOOL_URL": srv.url, "RESPOOL_TOKEN": agent_token}
            agent = await asyncio.create_subprocess_exec(
                *respool_command(), "agent", "--node", "n1", "--interval", "1", env=env,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            try:

                async def printed_done() -> bool:
                    r = await c.get(f"/v1/requests/{rid}/logs", headers=admin)
                    return r.status_code == 200 and any(
                        "DONE" in ch["data"] for ch in r.json()["chunks"]
                    )

                await first_true(printed_done)
                yield RunningJob(srv, admin, rid, go)
            finally:
                await stop(agent)
    finally:
        await conn.close()


async def test_dashboard_data_has_each_running_jobs_tail(running_job: RunningJob) -> None:
    c, admin, rid = running_job.srv.client, running_job.admin, running_job.request_id

    async def jobs() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = (await c.get("/v1/dashboard", headers=admin)).json()["jobs"]
        return got

    [job] = await jobs()
    assert {k: job[k] for k in ("request_id", "pool", "subject", "name", "status", "attempt")} == {
        "request_id": rid, "pool": "gpus", "subject": "team:train", "name": "printer",
        "status": "allocated", "attempt": 1,
    }  # fmt: skip
    assert job["node"] == "n1"
    # The last 20 lines of the attempt's output, stdout and stderr as they came, as text: what
    # GET /v1/requests/{id}/logs reads, cut to its end.
    expected = [f"line {i}" for i in range(13, 31)] + [HTML_LINE, "DONE"]
    assert job["tail"] == "\n".join(expected)
    logs = (await c.get(f"/v1/requests/{rid}/logs", headers=admin)).json()
    whole = "".join(ch["data"] for ch in logs["chunks"])
    assert whole.endswith(job["tail"] + "\n")
    # the next poll shows what the job printed since
    running_job.go.touch()

    async def more() -> list[dict[str, Any]] | None:
        now = await jobs()
        return now if now[0]["tail"].endswith("\nMORE") else None

    [job] = await first_true(more)
    assert job["tail"].split("\n") == expected[1:] + ["MORE"]


@needs_chromium
@pytest.mark.slow  # a headless browser
async def test_chromium_shows_a_jobs_tail_as_text(running_job: RunningJob, tmp_path: Path) -> None:
    async with DevTools.open(tmp_path / "profile") as dt:
        await dt.goto(running_job.srv.url + "/")
        await dt.wait_for("document.body.dataset.auth === 'needed'")
        await dt.submit_token(JOBS_ADMIN)
        await dt.wait_for("document.querySelector('pre.tail')")
        shown = await dt.js(
            "(() => { const j = document.querySelector('[data-job]');"
            " const pre = j.querySelector('pre.tail');"
            " return {job: j.dataset.job, head: j.querySelector('.job-head').textContent,"
            " text: pre.textContent, html: pre.innerHTML,"
            " elements: pre.querySelectorAll('*').length,"
            " section: !document.getElementById('jobs-section').hidden}; })()"
        )
        assert shown["job"] == running_job.request_id and shown["section"]
        assert "printer" in shown["head"] and "on n1" in shown["head"]
        assert shown["text"].split("\n")[-3:] == ["line 30", HTML_LINE, "DONE"]
        # the job's HTML is text: escaped in the page, no element made from it
        assert (
            "&lt;b&gt;bold&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;" in shown["html"]
        )
        assert shown["elements"] == 0
        # refreshed by the page's own poll
        running_job.go.touch()
        await dt.wait_for("document.querySelector('pre.tail').textContent.endsWith('MORE')")


async def test_job_log_tail_reads_the_last_lines(db_url: str) -> None:
    """respool.job_log_tail over chunks of every shape: one line each, many lines in one, a line
    longer than the bound, output that outgrew the per-attempt limit."""
    conn = await connect(db_url, application_name=APP_CLI)
    try:
        await conn.execute("SELECT respool.create_pool('tails', '{\"slot\": 100}')")
        await conn.execute("SELECT respool.create_policy('t', 'tails')")

        async def job() -> Any:
            body = {"subject": "t", "pool": "tails", "resources": {"slot": 1},
                    "job": {"command": ["x"]}}  # fmt: skip
            doc = await conn.fetchval(
                "SELECT request FROM respool.create_request($1::text::jsonb)", json.dumps(body)
            )
            got = json.loads(doc) if isinstance(doc, str) else doc
            assert got["status"] == "allocated", got
            return got["id"]

        async def append(rid: Any, seq: int, data: str, limit: int = 1_000_000) -> None:
            await conn.execute(
                "SELECT respool.append_job_log($1::uuid, 1, $2, 'stdout', $3, $4)",
                rid, seq, data, limit,
            )  # fmt: skip

        async def tail(rid: Any, lines: int = 20) -> Any:
            return await conn.fetchval("SELECT respool.job_log_tail($1::uuid, $2)", rid, lines)

        quiet = await job()
        assert await tail(quiet) is None  # no output yet
        each = await job()
        for i in range(100):
            await append(each, i, f"line {i}\n")
        assert await tail(each) == "\n".join(f"line {i}" for i in range(80, 100))
        assert await tail(each, 3) == "line 97\nline 98\nline 99"
        await append(each, 100, "partial")  # a last line without its newline yet counts
        assert (await tail(each, 2)) == "line 99\npartial"
        many = await job()
        await append(many, 0, "".join(f"row {i}\n" for i in range(500)))
        assert (await tail(many)).split("\n") == [f"row {i}" for i in range(480, 500)]
        wide = await job()
        await append(wide, 0, "x" * 20_000 + "\n")
        assert await tail(wide) == "x" * 8000  # at most 8000 characters
        capped = await job()  # 2 KiB kept per attempt: the head, a marker, the tail
        for i in range(200):
            await append(capped, i, f"output line number {i:03d}\n", limit=2048)
        shown = (await tail(capped, 200)).split("\n")
        assert shown[-1] == "output line number 199"
        assert any(re.fullmatch(r"\[\.\.\. \d+ bytes dropped \.\.\.\]", s) for s in shown), shown

        # Whatever the shape, the tail is the end of what GET /v1/requests/{id}/logs reads.
        async def whole(rid: Any) -> str:
            doc = await conn.fetchval("SELECT respool.job_logs($1::uuid, NULL, -1)", rid)
            doc = json.loads(doc) if isinstance(doc, str) else doc
            return "".join(c["data"] for c in doc["chunks"])

        shapes = {
            "one line each": [f"l{i}\n" for i in range(300)],
            "lines across chunks": [
                f"a{i} " + "b" * (i % 7) + ("\n" if i % 3 else "") for i in range(300)
            ],
            "few big chunks": ["".join(f"r{i}-{j}\n" for j in range(40)) for i in range(30)],
            "no newline at the end": ["x\n" * 5 + "partial"],
        }  # fmt: skip
        for limit in (1024, 2048, 4096, 1_000_000):
            for name, chunks in shapes.items():
                rid = await job()
                for seq, data in enumerate(chunks):
                    await append(rid, seq, data, limit=limit)
                text = (await whole(rid)).rstrip("\n").split("\n")
                for lines in (1, 5, 20, 200, 1000):
                    want = "\n".join(text[-lines:])[-8000:]
                    assert await tail(rid, lines) == want, (limit, name, lines)
    finally:
        await conn.close()
