"""Agent connections the control plane refused, counted per address and reason for the last hour.

A node refused at the TLS handshake (a certificate from another authority, none
at all) or at registration (a certificate naming another node) can only tell
its own log; an operator looking at the control plane saw a node that never
came. Each refusal is logged where it happens and counted here, so `llmgw ctl
status` and the cluster page can say "3 refused connections from 198.18.0.7 in
the last hour: certificate not signed by this control plane's authority".
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import attrs

WINDOW_S = 3600.0
# A client retrying in a tight loop must not grow the control plane's memory: past this many
# refusals in the window, the oldest are dropped (the counts then read low, never high).
MAX_KEPT = 10_000


@attrs.frozen
class Refused:
    """Refusals from one address for one reason within the window."""

    peer: str
    reason: str
    count: int
    # Seconds since the newest of them.
    last_s: float


class Refusals:
    """Each refused connection: when, from which address (no port), and why, in short words."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S) -> None:
        self._clock = clock
        self.window_s = window_s
        self._events: deque[tuple[float, str, str]] = deque(maxlen=MAX_KEPT)

    def refuse(self, peer: str, reason: str) -> None:
        """Count a refusal of the client at peer (host or host:port) for reason."""
        self._events.append((self._clock(), _host(peer), reason))

    def recent(self) -> list[Refused]:
        """Refusals within the window, grouped by address and reason, the most recent group first."""
        now = self._clock()
        while self._events and now - self._events[0][0] > self.window_s:
            self._events.popleft()
        groups: dict[tuple[str, str], tuple[int, float]] = {}
        for at, peer, reason in self._events:
            count, _ = groups.get((peer, reason), (0, at))
            groups[(peer, reason)] = (count + 1, at)
        return sorted(
            (
                Refused(peer=peer, reason=reason, count=count, last_s=round(now - at, 1))
                for (peer, reason), (count, at) in groups.items()
            ),
            key=lambda r: (r.last_s, r.peer, r.reason),
        )


def _host(peer: str) -> str:
    """ "198.18.0.7" of "198.18.0.7:51234", "::1" of "[::1]:51234": a client's port changes every time."""
    if peer.startswith("["):
        return peer[1:].partition("]")[0]
    host, sep, port = peer.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        return host
    return peer
