"""Keeping the server's long-lived objects out of the garbage collector's full passes.

A full collection walks every object the process holds. With thousands of
nodes connected that is millions of objects (their connections, streams and
what each registered), and a pass held the event loop, which the gateway
serves on, for up to half a second. Those objects live as long as their node:
once they have settled, `gc.freeze()` moves them where collections never look.
"""

from __future__ import annotations

import gc
from asyncio import sleep
from collections.abc import Callable

# How long registrations must have been quiet before what they built is frozen: a fleet
# connecting after a restart is one burst, frozen once, not once per node.
QUIET_S = 10.0


def freeze() -> None:
    """Collect the young generations (cheap), then keep every object alive now out of collections."""
    gc.collect(1)
    gc.freeze()


async def freeze_after_registrations(registrations: Callable[[], int], quiet_s: float = QUIET_S) -> None:
    """Freeze again each time nodes registered and then none did for quiet_s."""
    seen = registrations()
    pending = False
    while True:
        await sleep(quiet_s)
        now = registrations()
        if now != seen:
            seen, pending = now, True
        elif pending:
            freeze()
            pending = False
