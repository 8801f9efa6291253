"""A node's stream cut into messages as its bytes arrive: whole, once, in order, every byte acknowledged."""

from __future__ import annotations

import random
import struct

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from llmgw.control.stream.inbox import Inbox


def framed(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">?I", compressed, len(message)) + message


class Taken:
    """What an Inbox acknowledged and handed on."""

    def __init__(self) -> None:
        self.acked = 0
        self.messages: list[bytes] = []

    def ack(self, size: int) -> None:
        self.acked += size

    def inbox(self, max_message_bytes: int = 1 << 20) -> Inbox:
        return Inbox(self.ack, bytes, self.messages.append, max_message_bytes)


async def test_messages_cut_anywhere_across_frames_arrive_whole_once_and_in_order():
    rng = random.Random(21)
    for _ in range(200):
        messages = [rng.randbytes(rng.choice([0, 1, 5, 17, 300])) for _ in range(rng.randrange(1, 12))]
        wire = b"".join(framed(m) for m in messages)
        taken = Taken()
        inbox = taken.inbox()
        cuts = sorted(rng.sample(range(len(wire) + 1), rng.randrange(min(len(wire) + 1, 8))))
        for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
            inbox.add(wire[start:end], end - start)
        inbox.eof()
        assert taken.messages == messages
        assert taken.acked == len(wire)
        assert inbox.ended.done() and inbox.ended.exception() is None


async def test_a_stream_ending_inside_a_message_fails_saying_how_much_of_it_came():
    taken = Taken()
    inbox = taken.inbox()
    inbox.add(framed(b"whole") + framed(b"cut short")[:7], 17)
    inbox.eof()
    assert taken.messages == [b"whole"]
    with pytest.raises(GRPCError) as failed:
        inbox.ended.result()
    assert failed.value.status == Status.INVALID_ARGUMENT
    assert failed.value.message == "the stream ended inside a message (7 bytes of it had come)"


async def test_a_message_over_the_limit_ends_the_stream_before_its_bytes_are_kept():
    taken = Taken()
    inbox = taken.inbox(max_message_bytes=1000)
    # Only its prefix has come: the stream ends now, not after 4 GB have been buffered.
    inbox.add(struct.pack(">?I", False, 4_000_000_000), 5)
    with pytest.raises(GRPCError) as failed:
        inbox.ended.result()
    assert failed.value.status == Status.RESOURCE_EXHAUSTED
    assert failed.value.message == (
        "a message of 4000000000 bytes is more than the 1000 the control plane takes"
    )
    # What still arrives is acknowledged, so other streams on the connection are not starved, and dropped.
    inbox.add(b"x" * 900, 900)
    assert taken.acked == 905 and taken.messages == []


async def test_a_compressed_message_ends_the_stream_saying_so():
    taken = Taken()
    inbox = taken.inbox()
    inbox.add(framed(b"zipped", compressed=True), 11)
    with pytest.raises(GRPCError) as failed:
        inbox.ended.result()
    assert failed.value.status == Status.UNIMPLEMENTED
    assert failed.value.message == "this stream takes no compressed messages"


async def test_a_message_that_cannot_be_read_ends_the_stream_and_nothing_after_it_is_handed_on():
    def decode(data: bytes) -> bytes:
        if data == b"bad":
            raise KeyError("message")
        return data

    taken = Taken()
    inbox = Inbox(taken.ack, decode, taken.messages.append)
    inbox.add(framed(b"one") + framed(b"bad") + framed(b"three"), 24)
    inbox.add(framed(b"four"), 9)
    inbox.eof()
    assert taken.messages == [b"one"]
    with pytest.raises(GRPCError) as failed:
        inbox.ended.result()
    assert failed.value.status == Status.INVALID_ARGUMENT
    assert failed.value.message == "a message of 3 bytes could not be read as one an llmgw agent sends"


async def test_what_the_receiver_raises_ends_the_stream_with_it():
    refusal = GRPCError(Status.FAILED_PRECONDITION, "node n1 registered twice on one stream")

    def deliver(message: bytes) -> None:
        if message == b"again":
            raise refusal

    inbox = Inbox(lambda size: None, bytes, deliver)
    inbox.add(framed(b"beat") + framed(b"again") + framed(b"beat"), 27)
    assert inbox.ended.exception() is refusal


async def test_a_closed_inbox_hands_nothing_more_on_but_still_acknowledges():
    taken = Taken()
    inbox = taken.inbox()
    inbox.add(framed(b"one") + framed(b"two")[:6], 14)
    inbox.close()
    inbox.add(framed(b"two")[6:] + framed(b"three"), 12)
    assert taken.messages == [b"one"] and taken.acked == 26
    assert inbox.ended.done() and inbox.ended.exception() is None
