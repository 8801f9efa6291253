"""Keepalives on connections that must notice a vanished peer within seconds."""

from __future__ import annotations

import asyncio
import socket

from llmgw import keepalive


async def test_a_connection_is_probed_when_idle_and_ended_when_its_data_goes_unacknowledged() -> None:
    accepted: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert keepalive.keep_alive(writer.transport)
            sock = writer.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == keepalive.IDLE_S
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == keepalive.INTERVAL_S
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == keepalive.COUNT
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 6000
        finally:
            writer.close()
            await writer.wait_closed()
    finally:
        for other in accepted:
            other.close()
        server.close()
        await server.wait_closed()


def test_what_has_no_tcp_socket_is_left_alone() -> None:
    assert not keepalive.keep_alive(None)
