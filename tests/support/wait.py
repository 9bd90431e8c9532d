"""Bounded polling."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["first_true", "wait_until"]

T = TypeVar("T")


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


async def first_true(check: Callable[[], Awaitable[T] | T], within: float = 30.0) -> T:
    """Call ``check`` (sync or async) every 0.1 s until it answers something truthy, and return
    that answer (AssertionError after ``within`` seconds)."""
    end = asyncio.get_running_loop().time() + within
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got  # type: ignore[return-value]
        assert asyncio.get_running_loop().time() < end, "condition not met in time"
        await asyncio.sleep(0.1)
