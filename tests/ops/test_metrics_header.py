"""``/metrics`` names its media type once: Prometheus's text format, one ``charset``."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST

from support.server import Server


async def test_metrics_content_type_is_sent_once(server: Server) -> None:
    r = await server.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers.get_list("content-type") == ["text/plain; version=1.0.0; charset=utf-8"]
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST
