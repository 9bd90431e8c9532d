"""The step's environment of a placed grant (``grant.env()``, the same that ``respool run`` sets)
and how ``respool run`` names its node (``--selector``, ``--node``, ``--here``): from a wire
Request as the server answers it, and with the allocation held from a real server in a pool
backed by one node (docs/client.md, "The step's environment")."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from respool_client import AsyncRespool, Grant, Rejected, Request, Respool, allocated
from respool_client.run import here, host_node_name, node_selector

from support.http import ok
from support.server import Server, running_server
from support.wire import wire_request

GPU_UUIDS = [
    "GPU-5a3b8c2e-1f4d-4e6a-9b7c-0d1e2f3a4b5c",
    "GPU-6b4c9d3f-2a5e-4f7b-8c8d-1e2f3a4b5c6d",
]
MIG = "MIG-9f1c2d3e-4a5b-5c6d-7e8f-9a0b1c2d3e4f"


def _request(**fields: Any) -> Request:
    return wire_request(**{"attempt": 3, "max_retries": 5, "version": 4, **fields})


def test_placed_gpus_become_cuda_visible_devices_as_given() -> None:
    placement = {
        "node": "gpu-box-7",
        "labels": {"gpu-type": "A100-80G"},
        "devices": {"gpu": [*GPU_UUIDS, MIG], "nic": ["mlx5_1"]},
    }
    state = _request(placement=placement, resources={"gpu": 3, "nic": 1, "step_run": 1})
    grant = Grant(state)
    env = grant.env()
    assert env["CUDA_VISIBLE_DEVICES"] == f"{GPU_UUIDS[0]},{GPU_UUIDS[1]},{MIG}"
    assert env["RESPOOL_NODE"] == "gpu-box-7"
    assert json.loads(env["RESPOOL_DEVICES"]) == {"gpu": [*GPU_UUIDS, MIG], "nic": ["mlx5_1"]}
    assert env["RESPOOL_REQUEST_ID"] == str(state.id)
    assert env["RESPOOL_POOL"] == "a100s"
    assert env["RESPOOL_ATTEMPT"] == "3"
    assert json.loads(env["RESPOOL_RESOURCES"]) == {"gpu": 3, "nic": 1, "step_run": 1}
    assert grant.placement is not None and grant.placement.node == "gpu-box-7"
    assert grant.placement.labels == {"gpu-type": "A100-80G"}
    env["CUDA_VISIBLE_DEVICES"] = "changed"
    assert grant.env()["CUDA_VISIBLE_DEVICES"] != "changed"  # a fresh dict each call


def test_integer_indices_keep_their_order() -> None:
    placement = {"node": "n1", "labels": {}, "devices": {"gpu": ["6", "2", "10"]}}
    assert Grant(_request(placement=placement)).env()["CUDA_VISIBLE_DEVICES"] == "6,2,10"


def test_anonymous_units_on_a_node_set_no_cuda_visible_devices() -> None:
    # A node whose gpu key has no device list: the step is on a node, but which GPUs is not ours
    # to say.
    grant = Grant(_request(placement={"node": "n1", "labels": {}, "devices": {}}))
    env = grant.env()
    assert env["RESPOOL_NODE"] == "n1"
    assert json.loads(env["RESPOOL_DEVICES"]) == {}
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_a_pool_without_nodes_sets_no_node_variables() -> None:
    grant = Grant(_request())
    assert grant.placement is None
    assert set(grant.env()) == {
        "RESPOOL_REQUEST_ID",
        "RESPOOL_POOL",
        "RESPOOL_ATTEMPT",
        "RESPOOL_RESOURCES",
    }


@pytest.mark.parametrize(
    ("hostname", "expected"),
    [
        ("GPU-Box-07", "gpu-box-07"),
        ("gpu01.lab.example.com", "gpu01.lab.example.com"),
        ("-weird host!", "weird-host-"),
        ("x" * 80, "x" * 63),
    ],
)
def test_host_node_name_fits_the_node_name_pattern(hostname: str, expected: str) -> None:
    assert host_node_name(hostname) == expected


def test_host_node_name_refuses_a_name_with_nothing_left() -> None:
    with pytest.raises(ValueError, match="--node"):
        host_node_name("!!!")


def test_here_is_respool_node_else_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    assert here({"RESPOOL_NODE": "gpu-box-7"}) == "gpu-box-7"
    assert here({}) == host_node_name()
    monkeypatch.setenv("RESPOOL_NODE", "from-env")
    assert node_selector([], None, True) == {"node": "from-env"}


def test_selector_node_and_here_make_one_node_selector() -> None:
    pairs = [("gpu-type", "A100-80G"), ("zone", "b")]
    assert node_selector(pairs, None, False) == {"gpu-type": "A100-80G", "zone": "b"}
    assert node_selector(pairs, "n1", False) == {"gpu-type": "A100-80G", "zone": "b", "node": "n1"}
    assert node_selector([("node", "n1")], "n1", False) == {"node": "n1"}
    with pytest.raises(ValueError, match="disagree"):
        node_selector([("node", "n1")], "n2", False)
    with pytest.raises(ValueError, match="give one"):
        node_selector([], "n1", True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--node", "n1", "--here"], "--node and --here"),
        (["--selector", "gpu-type"], "expected KEY=VALUE"),
        (["--selector", "node=a", "--node", "b"], "disagree"),
    ],
)
def test_bad_placement_options_are_one_line_errors(options: list[str], message: str) -> None:
    run = [sys.executable, "-m", "respool_client.run", "-s", "x", *options, "--", "true"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


# --- held from a real server: a pool backed by one node with 8 named GPUs ---------------------


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Server]:
    async with running_server(db_url, with_reconciler=True, reconcile_interval=0.2) as srv:
        yield srv


async def _add_node(server: Server, **body: Any) -> None:
    """Register a node (``POST /v1/nodes``)."""
    ok(await server.client.post("/v1/nodes", json=body), 201)


async def _node_pool(server: Server) -> None:
    ok(await server.client.post("/v1/pools", json={"name": "a100s", "capacity": {}}), 201)
    await _add_node(
        server,
        name="box-1",
        pool="a100s",
        labels={"gpu-type": "A100-80G", "gpu-class": "a100"},
        capacity={"gpu": 2},
        devices={"gpu": GPU_UUIDS},
    )
    policy = {"subject": "team", "pool": "a100s", "reserved": {"gpu": 0}}
    ok(await server.client.post("/v1/policies", json=policy), 201)


async def test_allocate_with_a_node_selector_gives_the_placed_gpus(live: Server) -> None:
    await _node_pool(live)
    async with (
        AsyncRespool(live.url) as rp,
        rp.allocate(
            "team", resources={"gpu": 1}, node_selector={"gpu-type": "A100-80G"}, lease_seconds=60
        ) as grant,
    ):
        assert grant.placement is not None
        assert grant.placement.node == "box-1"
        assert grant.placement.labels["gpu-class"] == "a100"
        env = grant.env()
        assert env["CUDA_VISIBLE_DEVICES"] == GPU_UUIDS[0]  # the first free id in list order
        assert env["RESPOOL_NODE"] == "box-1"
        answer = ok(await live.client.get(f"/v1/requests/{grant.request_id}"))
        assert answer["node_selector"] == {"gpu-type": "A100-80G"}


async def test_the_sync_client_and_the_decorator_send_the_selector(live: Server) -> None:
    await _node_pool(live)

    def hold() -> tuple[dict[str, str], dict[str, str]]:
        with (
            Respool(live.url) as rp,
            rp.allocate("team", resources={"gpu": 1}, node_selector={"node": "box-1"}) as outer,
        ):

            @allocated(subject="team", url=live.url, resources={"gpu": 1},
                       node_selector={"gpu-class": "a100"})  # fmt: skip
            def step(grant: Grant) -> dict[str, str]:
                return grant.env()

            return outer.env(), step()

    outer, inner = await asyncio.to_thread(hold)
    assert {outer["CUDA_VISIBLE_DEVICES"], inner["CUDA_VISIBLE_DEVICES"]} == set(GPU_UUIDS)
    assert outer["RESPOOL_NODE"] == inner["RESPOOL_NODE"] == "box-1"


async def test_a_selector_no_node_matches_is_rejected(live: Server) -> None:
    await _node_pool(live)
    with pytest.raises(Rejected) as info:
        async with (
            AsyncRespool(live.url) as rp,
            rp.allocate("team", resources={"gpu": 1}, node_selector={"gpu-type": "H100"}),
        ):
            pass  # pragma: no cover - never granted
    assert info.value.reason == "no_fitting_node"
