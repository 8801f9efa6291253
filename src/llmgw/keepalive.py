"""TCP keepalives and a bound on unacknowledged data, for connections that must notice a peer gone.

A peer whose machine vanishes (power, a cable, a partition) sends no FIN and no
RST: without keepalives a connection that is idle waits for ever, and one with
data in flight retransmits for about fifteen minutes (tcp_retries2). The
connection holding the leadership's lock and an agent's stream to its control
plane both have to notice within seconds, so that another control plane can
take over, and the agent can find it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

# A peer silent this long is probed, a probe a second, and given up after three unanswered: about 6 s.
IDLE_S = 3
INTERVAL_S = 1
COUNT = 3
# Data the peer has not acknowledged for this long ends the connection too.
UNACKNOWLEDGED_S = 6.0


def keep_alive(transport: asyncio.BaseTransport | Any) -> bool:
    """Set keepalives and the unacknowledged-data bound on transport's TCP socket; whether it had one."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", IDLE_S), ("TCP_KEEPINTVL", INTERVAL_S), ("TCP_KEEPCNT", COUNT)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None:
        sock.setsockopt(socket.IPPROTO_TCP, option, int(UNACKNOWLEDGED_S * 1000))
    return True
