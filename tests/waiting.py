"""Waiting in tests for something to become true: polled against a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(predicate: Callable[[], object], within_s: float = 10.0) -> None:
    """Return once predicate() is true; fail the test when within_s passes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("the condition did not become true within the deadline")
        await asyncio.sleep(0.01)


async def eventually_async(predicate: Callable[[], Awaitable[object]], within_s: float = 10.0) -> None:
    """eventually(), for a predicate that must await (a query)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError("the condition did not become true within the deadline")
        await asyncio.sleep(0.01)
