"""The agent stream's messages, decoded without betterproto when they are plain heartbeats or a Register.

Nearly every message a node sends is a heartbeat that changes nothing: a
sequence number and the node's memory, about fifteen bytes. betterproto's
generated classes spend hundreds of microseconds on one (their
`__getattribute__` runs on every field access), which at thousands of nodes
filled the event loop the gateway shares. Such a heartbeat is read here by
hand, from the same wire format; anything else in it (a changed list, a field
this code does not know) goes to the generated classes as before, so a
message means the same whichever way it was read. A Register is read by hand
too (control/records.py), into the records the inventory keeps.
"""

from __future__ import annotations

from typing import NamedTuple

from llmgw.control.records import Registration, read_register
from llmgw.proto.llmgw import v1 as pb

# Tags of the fields read by hand (field number << 3 | wire type): a length-delimited
# AgentMessage.heartbeat (2), a varint Heartbeat.sequence (1), a length-delimited Heartbeat.memory
# (2) and Memory's two varints.
_HEARTBEAT = 2 << 3 | 2
_REGISTER = 1 << 3 | 2
_SEQUENCE = 1 << 3 | 0
_MEMORY = 2 << 3 | 2
_TOTAL_MB = 1 << 3 | 0
_AVAILABLE_MB = 2 << 3 | 0
_INT64 = 1 << 64


class Beat(NamedTuple):
    """A heartbeat that carries nothing but its sequence and, when the agent sent it, the memory."""

    sequence: int
    # (total_mb, available_mb), or None when the heartbeat had no memory field.
    memory: tuple[int, int] | None


class AgentMessages:
    """The request type grpclib is given for AgentService.Connect: it decodes with `FromString`."""

    # The name grpclib's codec calls.
    @staticmethod
    def FromString(data: bytes) -> pb.AgentMessage | Beat | Registration:
        return decode(data)


def decode(data: bytes) -> pb.AgentMessage | Beat | Registration:
    """A Beat when data is a heartbeat of only a sequence and memory, a Registration when it is only a
    Register, else the generated AgentMessage."""
    beat = _plain_heartbeat(data)
    if beat is not None:
        return beat
    register = _only_field(data, _REGISTER)
    if register is not None:
        return read_register(data[register:])
    return pb.AgentMessage.FromString(data)


def _only_field(data: bytes, tag: int) -> int | None:
    """Where the value starts when data is one length-delimited field of tag and nothing else."""
    if len(data) < 2 or data[0] != tag:
        return None
    length, at = _varint(data, 1)
    if at < 0 or at + length != len(data):
        return None
    return at


def _plain_heartbeat(data: bytes) -> Beat | None:
    # Any surprise (another field, a repeated one, a truncated varint) answers None: the generated
    # classes then decode it, or raise the error they always raised.
    at = _only_field(data, _HEARTBEAT)
    if at is None:
        return None
    sequence = 0
    memory: tuple[int, int] | None = None
    seen = 0
    while at < len(data):
        tag = data[at]
        if tag == _SEQUENCE and not seen & 1:
            value, at = _varint(data, at + 1)
            if at < 0:
                return None
            sequence = value - _INT64 if value >> 63 else value
            seen |= 1
        elif tag == _MEMORY and not seen & 2:
            size, at = _varint(data, at + 1)
            if at < 0 or at + size > len(data):
                return None
            memory = _memory(data, at, at + size)
            if memory is None:
                return None
            at += size
            seen |= 2
        else:
            return None
    return Beat(sequence, memory)


def _memory(data: bytes, at: int, end: int) -> tuple[int, int] | None:
    fields = [0, 0]
    seen = 0
    while at < end:
        tag = data[at]
        if tag == _TOTAL_MB and not seen & 1:
            index = 0
        elif tag == _AVAILABLE_MB and not seen & 2:
            index = 1
        else:
            return None
        value, at = _varint(data, at + 1)
        if at < 0 or at > end:
            return None
        fields[index] = value - _INT64 if value >> 63 else value
        seen |= 1 << index
    return fields[0], fields[1]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at data[at:] and the offset after it; an offset of -1 when it is cut short or too long."""
    value = 0
    shift = 0
    while at < len(data) and shift < 70:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            # Past 64 bits is not an int64 the generated classes would agree on: they decide.
            return (value, at) if value < _INT64 else (0, -1)
        shift += 7
    return 0, -1
