"""The agent service's TLS handshakes, made where a failure can be told to a person.

asyncio drops a failed server-side handshake without a word (an SSLError is an
OSError, logged only in debug mode), and a node that refuses this server's
certificate, because it does not name the address the node dialled, just hangs
up: asyncio does not flush its alert. The node could not join and the control
plane's log said nothing. So the agent service listens in plain TCP and upgrades
each connection itself with `loop.start_tls`, which knows who the peer is and
how the handshake ended.
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from collections.abc import Callable, Sequence
from typing import cast

import structlog

from llmgw.control.stream.refusals import Refusals

log = structlog.get_logger(__name__)

# As long as asyncio's own default: a slow node on a busy link still gets its handshake.
HANDSHAKE_TIMEOUT_S = 60.0
# What a connection reads from its socket at once: four TLS records' worth.
READ_BUFFER_BYTES = 64 * 1024
EVENT = "a TLS handshake on the agent service failed"


class Handshakes:
    """Plain protocols that upgrade to TLS, then hand the connection to the inner protocol."""

    def __init__(
        self,
        context: ssl.SSLContext,
        names: Sequence[str],
        refusals: Refusals,
        refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """refused("tls") is called for each connection whose handshake failed, for the metrics."""
        self._context = context
        # Counted as well as logged: the cluster page and `llmgw ctl status` show them.
        self._refusals = refusals
        self._refused = refused
        # The names this server's certificate has, for the message when a client refuses it.
        self._names = list(names)
        self._upgrades: set[asyncio.Task[None]] = set()
        # One read buffer for every connection, not asyncio's 256 KiB each (see shared_reads).
        self._reads = bytearray(READ_BUFFER_BYTES)

    def wrap(self, inner: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        """The protocol asyncio's server is given for one connection; inner() is made after TLS."""
        return _Plain(self, inner)

    def _upgrade(
        self, transport: asyncio.Transport, inner: Callable[[], asyncio.Protocol], early: list[bytes]
    ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(
            self._handshake(transport, inner, early), name="agentsvc-tls"
        )
        self._upgrades.add(task)
        task.add_done_callback(self._upgrades.discard)
        return task

    async def _handshake(
        self, transport: asyncio.Transport, inner: Callable[[], asyncio.Protocol], early: list[bytes]
    ) -> None:
        peer = transport.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if peer else "an unknown address"
        protocol = _Held(inner())
        loop = asyncio.get_running_loop()
        if early:
            # Scheduled before start_tls schedules its TLS layer's connection_made and the
            # transport's resume_reading: the layer takes these bytes first, before any read.
            loop.call_soon(hand_over, transport, b"".join(early))
        try:
            tls = await loop.start_tls(
                transport,
                protocol,
                self._context,
                server_side=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            )
        except asyncio.CancelledError:
            transport.close()
            raise
        except (OSError, TimeoutError) as exc:
            log.warning(EVENT, peer=where, error=handshake_failure(exc, where, self._names))
            self._refusals.refuse(where, refusal_reason(exc))
            self._refused("tls")
            transport.close()
            return
        if tls is not None:
            # Only on asyncio's own TLS layer. uvloop's takes no buffer from outside: it allocates
            # its own at a connection's first read, the 64 KiB libuv asks for, so on uvloop each
            # node's connection holds 64 KiB that here the one shared buffer holds for all.
            shared_reads(transport, self._reads)
            protocol.connection_made(tls)

    async def close(self) -> None:
        """Give up the handshakes still under way."""
        for task in list(self._upgrades):
            task.cancel()
        await asyncio.gather(*self._upgrades, return_exceptions=True)


class _Plain(asyncio.Protocol):
    """One connection until its handshake starts; start_tls then takes the transport over."""

    def __init__(self, handshakes: Handshakes, inner: Callable[[], asyncio.Protocol]) -> None:
        self._handshakes = handshakes
        self._inner = inner
        self._upgrade: asyncio.Task[None] | None = None
        self._transport: asyncio.Transport | None = None
        # What arrived before start_tls took the transport over (on uvloop only, see connection_made).
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # What a stream socket's transport is on any loop: uvloop's are not asyncio.Transport's
        # subclasses, only alike.
        assert callable(getattr(transport, "pause_reading", None))
        plain = self._transport = cast(asyncio.Transport, transport)
        # Before any byte arrives here: the ClientHello is for start_tls to read. uvloop starts
        # reading only after connection_made returns, so there this does nothing and the first
        # bytes may still come to data_received.
        plain.pause_reading()
        self._upgrade = self._handshakes._upgrade(plain, self._inner, self._early)

    def data_received(self, data: bytes) -> None:
        # Only on a loop where pause_reading came too early (uvloop): kept for the TLS layer.
        self._early.append(data)
        if self._transport is not None:
            self._transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        # Gone before start_tls took the transport: nothing would ever end its handshake.
        if self._upgrade is not None:
            self._upgrade.cancel()


class _Held(asyncio.Protocol):
    """The inner protocol, held back until start_tls has returned the TLS transport.

    start_tls may pass on the first bytes after the handshake (a node's HTTP/2
    preface arrives with its last handshake message) before it returns, and the
    inner protocol cannot take data before connection_made: they wait here.
    """

    def __init__(self, inner: asyncio.Protocol) -> None:
        self._inner = inner
        self._connected = False
        self._early: list[bytes] = []
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connected = True
        self._inner.connection_made(transport)
        for data in self._early:
            self._inner.data_received(data)
        self._early.clear()
        if self._eof:
            self._inner.eof_received()

    def data_received(self, data: bytes) -> None:
        if self._connected:
            self._inner.data_received(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self._connected:
            return self._inner.eof_received()
        self._eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._connected:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def hand_over(transport: asyncio.BaseTransport, data: bytes) -> None:
    """Give the TLS layer start_tls put on transport the bytes that were read before it was there.

    Both asyncio's and uvloop's layers keep what they are given before their
    connection_made and read it as the handshake starts.
    """
    layer = transport.get_protocol()
    if isinstance(layer, asyncio.BufferedProtocol) or hasattr(layer, "buffer_updated"):
        buffered = cast(asyncio.BufferedProtocol, layer)
        view = memoryview(data)
        while view:
            buffer = memoryview(buffered.get_buffer(len(view)))
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            buffered.buffer_updated(size)
            view = view[size:]
    else:
        cast(asyncio.Protocol, layer).data_received(data)


def shared_reads(transport: asyncio.BaseTransport, buffer: bytearray) -> None:
    """Have the TLS layer on transport read its socket into buffer, which other connections share.

    asyncio gives each TLS connection a 256 KiB read buffer of its own and no
    way to size it: at thousands of nodes that was most of the server's
    memory. Sharing is safe because the buffer is only lent for the moment of
    a read: the event loop asks for it, receives into it and hands the bytes
    on (`get_buffer`, `recv_into`, `buffer_updated`) in one step, without
    yielding to another connection, and the TLS layer copies them out at once.
    On a Python whose TLS layer is built otherwise, nothing changes.
    """
    layer = transport.get_protocol()
    # A proactor loop holds the buffer for as long as a read is pending: there it could not be shared.
    if (
        not isinstance(asyncio.get_running_loop(), asyncio.SelectorEventLoop)
        or not isinstance(layer, sslproto.SSLProtocol)
        or not isinstance(getattr(layer, "_ssl_buffer", None), bytearray)
    ):
        return
    # Through vars(): these are the instance's own attributes in asyncio, which its stubs do not list.
    vars(layer).update(max_size=len(buffer), _ssl_buffer=buffer, _ssl_buffer_view=memoryview(buffer))


def refusal_reason(exc: BaseException) -> str:
    """Why a handshake failed, in the few words a count of refusals is listed with."""
    text = str(exc)
    if isinstance(exc, ssl.SSLError) and "peer did not return a certificate" in text:
        return "no certificate presented"
    if isinstance(exc, ssl.SSLError) and "certificate has expired" in text:
        return "certificate has expired"
    if isinstance(exc, ssl.SSLError) and "certificate verify failed" in text:
        return "certificate not signed by this control plane's authority"
    if isinstance(exc, ssl.SSLError) and "alert" in text:
        return "the client does not accept this server's certificate"
    if isinstance(exc, ConnectionResetError):
        return "hung up during the TLS handshake"
    if isinstance(exc, TimeoutError):
        return f"did not finish the TLS handshake within {HANDSHAKE_TIMEOUT_S:g} s"
    return f"TLS handshake failed: {getattr(exc, 'reason', None) or exc or type(exc).__name__}"


def handshake_failure(exc: BaseException, peer: str, names: Sequence[str]) -> str:
    """Why the handshake with the client at peer failed, for the person reading this server's log."""
    named = ", ".join(names) or "no name"
    advice = (
        f"this server's certificate names {named}: a node must dial one of those in its servers: and "
        "trust the authority that signed it (tls.ca); add a name with `llmgw server init --host NAME`"
    )
    if isinstance(exc, ssl.SSLError) and "alert" in str(exc):
        return f"the client at {peer} does not accept this server's certificate ({exc.reason}); {advice}"
    if isinstance(exc, ConnectionResetError):
        # What a node refusing the certificate looks like from here: asyncio does not send its
        # alert. A health check that only opens the port looks the same, hence "as".
        return (
            f"the client at {peer} hung up during the TLS handshake, as a node does when it does not "
            f"accept this server's certificate; {advice}"
        )
    if isinstance(exc, ssl.SSLError) and "peer did not return a certificate" in str(exc):
        return (
            f"the client at {peer} presented no certificate; "
            "a node needs one from `llmgw cert issue-agent NODE`"
        )
    if isinstance(exc, ssl.SSLError) and "certificate verify failed" in str(exc):
        return (
            f"the client at {peer} presented a certificate this server does not trust ({exc.reason}): "
            "a node's certificate must be signed by the authority in this server's tls.ca "
            "(`llmgw cert issue-agent NODE`)"
        )
    if isinstance(exc, TimeoutError):
        return f"the client at {peer} did not finish the handshake within {HANDSHAKE_TIMEOUT_S:g} s"
    return f"the handshake with the client at {peer} failed: {exc or type(exc).__name__}"
