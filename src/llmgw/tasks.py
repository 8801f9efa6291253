"""Tasks that live and die together: the two directions of one stream, for instance."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def first_to_finish(*coros: Coroutine[Any, Any, Any]) -> None:
    """Run coros as tasks until one returns or raises; cancel and await the others, then re-raise.

    A stream's reader and writer have no use without each other: when the peer
    ends the stream the reader returns, and the writer must not be left behind
    blocked on a queue nobody will fill.
    """
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()
