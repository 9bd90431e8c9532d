"""respool_zenml.transport: respool's answers become the errors ZenML's server maps to HTTP.

404 → KeyError (ZenML: 404, and a vanished request counts as cancelled), other 4xx → ValueError
(400), unreachable or 5xx → RespoolUnavailable (500, naming respool's URL). Never a silent
fallback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integrations" / "zenml"))

from respool_zenml.transport import RespoolApi, RespoolUnavailable  # type: ignore[import-not-found]  # noqa: E402,I001  (sys.path above)

RID = "4f9bf2e7-12a1-42fd-8e3b-f59e4e9ca06f"


def _api(answer: Callable[[httpx.Request], httpx.Response]) -> Iterator[RespoolApi]:
    api = RespoolApi(
        "http://respool.test", "tok", transport=httpx.MockTransport(answer), retry_for=0.3
    )
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def seen() -> list[httpx.Request]:
    return []


def _error(status: int, detail: str) -> httpx.Response:
    return httpx.Response(status, json={"status_code": status, "detail": detail, "field": None})


def test_heartbeat_sends_lease_seconds_and_the_token(seen: list[httpx.Request]) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _error(404, f"request {RID} not found")

    for api in _api(answer):
        with pytest.raises(KeyError, match="not found"):
            api.heartbeat(RID, lease_seconds=315)
    (request,) = seen
    assert request.url.path == f"/v1/requests/{RID}/heartbeat"
    assert request.url.params["lease_seconds"] == "315"
    assert request.headers["authorization"] == "Bearer tok"


def test_a_refusal_is_a_value_error_with_respools_detail() -> None:
    for api in _api(lambda _: _error(400, "lease_seconds must be between 1 and 31536000")):
        with pytest.raises(ValueError, match="lease_seconds must be between"):
            api.heartbeat(RID, lease_seconds=0)


@pytest.mark.parametrize("status", [500, 503])
def test_a_server_error_is_respool_unavailable(status: int) -> None:
    for api in _api(lambda _: _error(status, "database unavailable")):
        with pytest.raises(RespoolUnavailable, match="respool at http://respool.test"):
            api.release(RID)


def test_unreachable_respool_is_a_clear_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    for api in _api(refuse):
        with pytest.raises(RespoolUnavailable) as info:
            api.create_request("orchestrator:prod", resources={"gpu": 1})
    assert "http://respool.test is unreachable" in str(info.value)
    assert "until it is back" in str(info.value)


def test_list_policies_reads_every_policy_the_token_may_read(seen: list[httpx.Request]) -> None:
    policy = {"subject": "orchestrator:prod", "pool": "gpus", "priority": 0}

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=[policy])

    for api in _api(answer):
        assert api.list_policies() == [policy]
    (request,) = seen
    assert (request.method, request.url.path) == ("GET", "/v1/policies")
