"""A node's messages, handed to the agent service as their bytes arrive, with no task woken for each.

grpclib gives a handler each message through a chain of coroutines
(`__anext__`, `recv_message`, `recv_data`, `Buffer.read`, `Queue.get`) that
waits on a future. A node's chain is made anew for every heartbeat and lives
until the next one, and since each replaced the last, the garbage collector's
count of young objects never grew: at 10,000 nodes its young generations held
120,000 of these objects, and each collection that finally walked them held
the event loop, which the gateway serves on, 100–280 ms, several times a
minute. Waking a task per heartbeat was also most of what one cost.

Once a node has registered, an Inbox takes the place of grpclib's buffer on its
stream: the bytes grpclib receives are cut into messages right there, in the
callback that received them, and each is handed on, decoded, at once. Nothing
is left waiting per message. The bytes are acknowledged to HTTP/2's flow
control as they arrive, which is when they are consumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from grpclib import protocol
from grpclib.const import Status
from grpclib.exceptions import GRPCError

# gRPC's own framing: a compressed flag, then the message's length in four bytes, big-endian.
_PREFIX = 5
# Above any message an agent sends (a Register is tens of KiB; the largest, a log reply, is at most
# 2,000 lines of 4,000 characters, 8 MB), and short of letting one connection fill the server's memory.
MAX_MESSAGE_BYTES = 16 << 20


class Inbox(protocol.Buffer):
    """grpclib's per-stream Buffer, replaced: whole messages go to deliver as soon as they are in.

    `ended` resolves when the node ends its stream, or fails with the error the
    stream should end with: a message that could not be read, or whatever
    deliver raised. After that, nothing more is delivered.
    """

    def __init__(
        self,
        ack: Callable[[int], None],
        decode: Callable[[bytes], Any],
        deliver: Callable[[Any], None],
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        # Not Buffer's own __init__: its queue and deques (about 2 KB a node) would hold nothing here.
        self._ack = ack
        self._decode = decode
        self._deliver = deliver
        self._max = max_message_bytes
        self._pending = bytearray()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def add(self, data: bytes, ack_size: int) -> None:
        # Acknowledged even after the end: the window of a connection other streams may share stays open.
        self._ack(ack_size)
        if self.ended.done():
            return
        self._pending += data
        self._hand_on()

    def eof(self) -> None:
        if not self.ended.done():
            if self._pending:
                inside = f"the stream ended inside a message ({len(self._pending)} bytes of it had come)"
                self._fail(GRPCError(Status.INVALID_ARGUMENT, inside))
            else:
                self.ended.set_result(None)

    def close(self) -> None:
        """Hand nothing more on: the stream's handler has ended (a newer stream, or the server stops)."""
        self._pending.clear()
        if not self.ended.done():
            self.ended.set_result(None)

    async def read(self, size: int) -> bytes:
        raise RuntimeError("an Inbox hands its messages on as they arrive; nothing reads them")

    def unacked_size(self) -> int:
        return 0

    def _hand_on(self) -> None:
        pending = self._pending
        start = 0
        try:
            while len(pending) - start >= _PREFIX:
                if pending[start]:
                    raise GRPCError(Status.UNIMPLEMENTED, "this stream takes no compressed messages")
                size = int.from_bytes(pending[start + 1 : start + _PREFIX], "big")
                if size > self._max:
                    raise GRPCError(
                        Status.RESOURCE_EXHAUSTED,
                        f"a message of {size} bytes is more than the {self._max} the control plane takes",
                    )
                end = start + _PREFIX + size
                if len(pending) < end:
                    break
                message = self._read(pending[start + _PREFIX : end])
                start = end
                self._deliver(message)
        # Whatever went wrong ends this node's stream, with this as its status, and nothing else.
        except Exception as exc:
            self._fail(exc)
            return
        del pending[:start]

    def _read(self, data: bytearray) -> Any:
        try:
            return self._decode(bytes(data))
        except Exception as exc:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"a message of {len(data)} bytes could not be read as one an llmgw agent sends",
            ) from exc

    def _fail(self, exc: BaseException) -> None:
        self._pending.clear()
        if not self.ended.done():
            self.ended.set_exception(exc)


def take_over(
    stream: protocol.Stream, decode: Callable[[bytes], Any], deliver: Callable[[Any], None]
) -> Inbox:
    """An Inbox in place of stream's buffer, handed what grpclib's own had received and not given out.

    The node may have sent its first heartbeats in the same frames as its
    Register: those bytes are in the old buffer, some acknowledged (`_acked`),
    some not (`_unacked`, its end of stream among them).
    """
    assert stream.id is not None, "a stream the node opened has its id"
    inbox = Inbox(partial(stream.connection.ack, stream.id), decode, deliver)
    old = stream.buffer
    stream.buffer = inbox
    for chunk, _ in old._acked:
        inbox.add(bytes(chunk), 0)
    old._acked.clear()
    while not old._unacked.empty():
        data, _, ack_size = old._unacked.get_nowait()
        if ack_size:
            inbox.add(data, ack_size)
        else:
            inbox.eof()
    return inbox
