"""Tasks that live and die together: the two directions of one stream, for instance."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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


async def to_thread_to_the_end(func: Callable[..., T], *args: Any) -> T:
    """func(*args) in a thread, waited for even through a cancel, which is raised once it has returned.

    A cancel landing on a plain to_thread stops the wait, not the thread: a write still running
    raced the close that follows it, and a close not yet started was dropped, leaking the .part
    file (an agent stopped mid-download, then its cache closed, cancels twice in a row).
    """
    running = asyncio.ensure_future(asyncio.to_thread(func, *args))
    cancelled = False
    while not running.done():
        try:
            # wait(), unlike awaiting the task, leaves it running when this is cancelled.
            await asyncio.wait([running])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        running.exception()  # retrieved: the cancel is what the caller asked for, not lost news
        raise asyncio.CancelledError
    return running.result()
