"""Bounded polling."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

__all__ = ["wait_until"]


async def wait_until(
    check: Callable[[], Awaitable[bool] | bool],
    what: str,
    *,
    within: float = 20.0,
    step: float = 0.05,
) -> float:
    """Poll ``check`` (sync or async) until true; returns the seconds it took (AssertionError
    after ``within`` seconds)."""
    start = time.monotonic()
    while True:
        done = check()
        if await done if inspect.isawaitable(done) else done:
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(step)
