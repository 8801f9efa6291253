"""Keeping the server's long-lived objects out of the garbage collector's full passes.

A full collection walks every object the process holds. With thousands of
nodes connected that is millions of objects (their connections, streams and
what each registered), and a pass held the event loop, which the gateway
serves on, for up to half a second. Those objects live as long as their node:
once they have settled, `gc.freeze()` moves them where collections never look.

A fleet reconnecting after a restart registers for minutes. Frozen only once
it had gone quiet, it was walked whole by a full collection every 10–15 s
while it registered (5,000 nodes: 0.2–0.7 s of CPU each, up to 1.9 s of the
loop on a loaded machine, collecting nothing), and the longer passes left
nodes silent past their grace. What a burst builds is now frozen every
`QUIET_S` while it lasts, and once more when it has gone quiet.
"""

from __future__ import annotations

import gc
from asyncio import sleep
from collections.abc import Callable

# How often what registrations built is frozen while they go on, and how long they must have
# been quiet for the last of it: a freeze per period, not one per node.
QUIET_S = 10.0


def freeze() -> None:
    """Collect the young generations (cheap), then keep every object alive now out of collections."""
    gc.collect(1)
    gc.freeze()


async def freeze_after_registrations(registrations: Callable[[], int], quiet_s: float = QUIET_S) -> None:
    """Freeze every quiet_s in which nodes registered, and once more when none did for quiet_s."""
    seen = registrations()
    pending = False
    while True:
        await sleep(quiet_s)
        now = registrations()
        if now != seen:
            seen, pending = now, True
            freeze()
        elif pending:
            # What the last registrations built after the freeze above, now that it has settled.
            freeze()
            pending = False
