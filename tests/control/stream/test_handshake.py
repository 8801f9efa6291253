"""The agent service's own TLS handshakes: each failure logged in words, with the client's address."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import ssl
from typing import Any, cast

import uvloop
from structlog.testing import capture_logs

from llmgw.config import TLSConfig
from llmgw.control.inventory import Inventory
from llmgw.control.stream.handshake import EVENT, Handshakes
from llmgw.control.stream.refusals import Refusals
from llmgw.control.stream.service import serve_agents
from llmgw.pki import client_ssl_context, server_ssl_context


async def _handshake(port: int, context: ssl.SSLContext) -> None:
    with contextlib.suppress(OSError):
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
        writer.close()
        await writer.wait_closed()


def _failures(logs: list[dict[str, Any]]) -> list[str]:
    return [entry["error"] for entry in logs if entry["event"] == EVENT]


async def _failure_for(server_cfg, eventually, context: ssl.SSLContext) -> str:
    inventory = Inventory(server_cfg.control.grace_s)
    with capture_logs() as logs:
        async with serve_agents(server_cfg, inventory) as port:
            await _handshake(port, context)
            await eventually(lambda: _failures(logs))
    assert inventory.nodes() == []
    [failure] = _failures(logs)
    assert "the client at 127.0.0.1:" in failure
    return failure


async def test_a_client_that_refuses_the_servers_certificate_is_told_which_names_it_has(
    server_cfg, fleet, eventually
):
    # A node trusting another authority refuses this server's certificate and hangs up.
    other_ca = fleet.server.ca.replace("/ca/ca.pem", "/other-ca/ca.pem")
    n1 = fleet.agents["n1"]
    context = await asyncio.to_thread(client_ssl_context, TLSConfig(ca=other_ca, cert=n1.cert, key=n1.key))
    failure = await _failure_for(server_cfg, eventually, context)
    assert "does not accept this server's certificate" in failure
    assert "this server's certificate names localhost, 127.0.0.1" in failure


async def test_a_client_whose_certificate_another_authority_signed_is_told_so(server_cfg, fleet, eventually):
    context = await asyncio.to_thread(client_ssl_context, fleet.stranger)
    failure = await _failure_for(server_cfg, eventually, context)
    assert "presented a certificate this server does not trust" in failure


async def test_a_client_without_a_certificate_is_told_to_get_one(server_cfg, fleet, eventually):
    context = await asyncio.to_thread(ssl.create_default_context, cafile=fleet.server.ca)
    failure = await _failure_for(server_cfg, eventually, context)
    assert "presented no certificate" in failure


class _Digest(asyncio.Protocol):
    """Answers the sha256 of what arrived once expected bytes are in."""

    def __init__(self, expected: int, transports: list[asyncio.Transport]) -> None:
        self._expected = expected
        self._transports = transports
        self._got = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are alike, not asyncio.Transport's subclasses.
        self._transport = cast(asyncio.Transport, transport)
        self._transports.append(self._transport)

    def data_received(self, data: bytes) -> None:
        self._got += data
        if len(self._got) == self._expected:
            self._transport.write(hashlib.sha256(self._got).digest())


async def _digests(server_cfg, fleet, size: int, count: int) -> list[asyncio.Transport]:
    """count clients send size bytes each at once through Handshakes; the transports it served."""
    loop = asyncio.get_running_loop()
    transports: list[asyncio.Transport] = []
    context = await asyncio.to_thread(server_ssl_context, server_cfg.tls)
    handshakes = Handshakes(context, ["localhost"], Refusals())
    server = await loop.create_server(
        lambda: handshakes.wrap(lambda: _Digest(size, transports)), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    client = await asyncio.to_thread(client_ssl_context, fleet.agents["n1"])

    async def send(payload: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="localhost"
        )
        for at in range(0, len(payload), 50_000):
            writer.write(payload[at : at + 50_000])
            await writer.drain()
        digest = await reader.readexactly(32)
        writer.close()
        await writer.wait_closed()
        return digest

    try:
        payloads = [os.urandom(size) for _ in range(count)]
        # The connections writing at once, their reads interleaved.
        digests = await asyncio.gather(*(send(p) for p in payloads))
        assert digests == [hashlib.sha256(p).digest() for p in payloads]
        return transports
    finally:
        server.close()
        await handshakes.close()
        await server.wait_closed()


async def test_connections_share_one_read_buffer_and_large_messages_still_arrive_whole(server_cfg, fleet):
    transports = await _digests(server_cfg, fleet, 700 * 1024, 4)
    if isinstance(asyncio.get_running_loop(), asyncio.SelectorEventLoop):
        buffers = {id(t._ssl_protocol._ssl_buffer) for t in transports}  # type: ignore[attr-defined]
        # asyncio's own is 256 KiB for each connection: most of what a node used to cost.
        assert len(buffers) == 1


def test_connections_complete_their_handshake_on_uvloop(server_cfg, fleet):
    # uvloop starts reading a connection only after connection_made, so the ClientHello can reach
    # the plain protocol before start_tls: it must still reach the TLS layer.
    async def served() -> None:
        async with asyncio.timeout(30):
            await _digests(server_cfg, fleet, 200 * 1024, 4)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(served())
