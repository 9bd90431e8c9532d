"""Without JavaScript the dashboard page says where to look instead of only ``loading…``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from support.server import Server, running_server


@pytest.fixture
async def live(db_url: str) -> AsyncIterator[Server]:
    async with running_server(db_url) as srv:
        yield srv


async def test_without_javascript_the_page_names_the_cli(live: Server) -> None:
    page = (await live.client.get("/")).text
    shown = re.search(r"<noscript>(.*?)</noscript>", page, re.S)
    assert shown is not None, "no <noscript> text"
    text = re.sub(r"<[^>]+>", "", shown.group(1))
    assert "respool pool list" in text and "JavaScript" in text
