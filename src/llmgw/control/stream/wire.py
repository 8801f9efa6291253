"""The agent stream's messages read by hand from protobuf's wire format: plain heartbeats and Registers.

Nearly every message a node sends is a heartbeat that changes nothing: a
sequence number and the node's memory, about fifteen bytes. betterproto's
generated classes spend hundreds of microseconds on one (their
`__getattribute__` runs on every field access), which at thousands of nodes
filled the event loop the gateway shares. Such a heartbeat is read here by
hand; anything else in it (a changed list, a field this code does not know)
goes to the generated classes as before, so a message means the same whichever
way it was read.

A GPU node's Register is about a kilobyte: its GPUs, memory, disks, weights
and host. The generated classes took about 10 ms of the server's CPU to decode
one (40 ms on a loaded machine), so a fleet of thousands reconnecting after a
restart took minutes to come back. It is read here into the compact records of
control/records.py. Bytes this reader cannot read (a value cut short, text that
is not UTF-8, a field sent with another wire type than its declaration's) go to
the generated classes, to raise the error they always raised; where those would
read them anyway, into a field of the wrong type, the Register is refused here.
A field the declaration does not know is skipped, as the generated classes skip it.

One reader of the wire format for both: the varints, fields and scalars below.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, NamedTuple, TypeVar

from llmgw.control.records import (
    Fabric,
    Gpu,
    Host,
    Memory,
    ProvisionStatus,
    Registration,
    Storage,
    Weights,
)
from llmgw.proto.llmgw import v1 as pb

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_INT64 = 1 << 64
# Field kinds of the declarations below.
_STR, _INT32, _INT64_, _BOOL, _STRS = "str", "int32", "int64", "bool", "strs"

# Tags of the fields a plain heartbeat is read by (field number << 3 | wire type): a length-delimited
# AgentMessage.register (1) or AgentMessage.heartbeat (2), a varint Heartbeat.sequence (1), a
# length-delimited Heartbeat.memory (2) and Memory's two varints.
_REGISTER_TAG = 1 << 3 | _LEN
_HEARTBEAT_TAG = 2 << 3 | _LEN
_SEQUENCE_TAG = 1 << 3 | _VARINT
_MEMORY_TAG = 2 << 3 | _LEN
_TOTAL_MB_TAG = 1 << 3 | _VARINT
_AVAILABLE_MB_TAG = 2 << 3 | _VARINT


class _Unexpected(Exception):
    """Bytes this reader cannot read; says why."""


# --- an AgentMessage ---------------------------------------------------------------------


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
    register = _only_field(data, _REGISTER_TAG)
    if register is not None:
        return read_register(data[register:])
    return pb.AgentMessage.FromString(data)


def _only_field(data: bytes, tag: int) -> int | None:
    """Where the value starts when data is one length-delimited field of tag and nothing else."""
    if len(data) < 2 or data[0] != tag:
        return None
    try:
        length, at = _varint(data, 1, len(data))
    except _Unexpected:
        return None
    return at if at + length == len(data) else None


def _plain_heartbeat(data: bytes) -> Beat | None:
    # Any surprise (another field, a repeated one, a truncated varint) answers None: the generated
    # classes then decode it, or raise the error they always raised.
    at = _only_field(data, _HEARTBEAT_TAG)
    if at is None:
        return None
    end = len(data)
    sequence = 0
    memory: tuple[int, int] | None = None
    seen = 0
    try:
        while at < end:
            tag = data[at]
            if tag == _SEQUENCE_TAG and not seen & 1:
                value, at = _int64(data, at + 1, end)
                sequence = value - _INT64 if value >> 63 else value
                seen |= 1
            elif tag == _MEMORY_TAG and not seen & 2:
                size, at = _varint(data, at + 1, end)
                if at + size > end:
                    return None
                memory = _memory(data, at, at + size)
                at += size
                seen |= 2
            else:
                return None
    except _Unexpected:
        return None
    return Beat(sequence, memory)


def _memory(data: bytes, at: int, end: int) -> tuple[int, int]:
    fields = [0, 0]
    seen = 0
    while at < end:
        tag = data[at]
        if tag == _TOTAL_MB_TAG and not seen & 1:
            index = 0
        elif tag == _AVAILABLE_MB_TAG and not seen & 2:
            index = 1
        else:
            raise _Unexpected("a Memory with another field than its two")
        value, at = _int64(data, at + 1, end)
        fields[index] = value - _INT64 if value >> 63 else value
        seen |= 1 << index
    return fields[0], fields[1]


def _int64(data: bytes, at: int, end: int) -> tuple[int, int]:
    """The varint at data[at:end], which must fit in 64 bits, and the offset after it."""
    value, at = _varint(data, at, end)
    if value >= _INT64:
        # Past 64 bits is not an int64 the generated classes would agree on: they decide.
        raise _Unexpected("a number longer than 64 bits")
    return value, at


# --- a Register ---------------------------------------------------------------------------


_R = TypeVar("_R")
# field number -> (attribute, kind); a kind that is a record class is a message field of it.
_Fields = dict[int, tuple[str, Any]]

_GPU: _Fields = {
    1: ("index", _INT32),
    2: ("uuid", _STR),
    3: ("name", _STR),
    4: ("gpu_class", _STR),
    5: ("memory_total_mb", _INT64_),
    6: ("memory_used_mb", _INT64_),
    7: ("healthy", _BOOL),
    8: ("unhealthy_reason", _STR),
}
_MEMORY: _Fields = {1: ("total_mb", _INT64_), 2: ("available_mb", _INT64_)}
_FABRIC: _Fields = {1: ("name", _STR), 2: ("hcas", _STRS)}
_STORAGE: _Fields = {1: ("path", _STR), 2: ("total_bytes", _INT64_), 3: ("free_bytes", _INT64_)}
_WEIGHTS: _Fields = {
    1: ("source", _STR),
    2: ("path", _STR),
    3: ("size_bytes", _INT64_),
    4: ("sha256", _STR),
    5: ("in_use", _BOOL),
}
_HOST: _Fields = {
    1: ("os_id", _STR),
    2: ("os_version", _STR),
    3: ("os_codename", _STR),
    4: ("arch", _STR),
    5: ("cpu_flags", _STRS),
    6: ("nvidia_driver", _STR),
    7: ("family", _STR),
    8: ("id_like", _STRS),
}
_PROVISION: _Fields = {
    1: ("engine", _STR),
    2: ("version", _STR),
    3: ("variant", _STR),
    4: ("state", _STR),
    5: ("detail", _STR),
    6: ("next_try_s", _INT32),
}
_SCHEMAS: dict[type[Any], _Fields] = {
    Gpu: _GPU,
    Memory: _MEMORY,
    Fabric: _FABRIC,
    Storage: _STORAGE,
    Weights: _WEIGHTS,
    Host: _HOST,
    ProvisionStatus: _PROVISION,
}
# Register's fields: (attribute, kind, repeated).
_REGISTER: dict[int, tuple[str, Any, bool]] = {
    1: ("node_id", _STR, False),
    2: ("agent_version", _STR, False),
    3: ("gpus", Gpu, True),
    4: ("memory", Memory, False),
    5: ("engine_versions", dict, False),
    6: ("running", pb.ShardStatus, True),
    7: ("weights", Weights, True),
    8: ("labels", dict, False),
    9: ("fabrics", Fabric, True),
    10: ("heartbeat_interval_ms", _INT32, False),
    12: ("storage", Storage, True),
    13: ("host", Host, False),
    14: ("engines_probed", _BOOL, False),
    15: ("provision", ProvisionStatus, True),
    16: ("warnings", _STR, True),
    17: ("advertise_address", _STR, False),
    18: ("fabric_address", _STR, False),
}
_WIRE = {_STR: _LEN, _STRS: _LEN, _INT32: _VARINT, _INT64_: _VARINT, _BOOL: _VARINT}


def read_register(data: bytes) -> Registration:
    """The Register encoded in data; raises what the generated classes raise on bytes they refuse."""
    try:
        return _register(data)
    except _Unexpected as exc:
        why = str(exc)
    pb.Register.FromString(data)
    raise ValueError(f"cannot read a node's Register: {why}")


def registration(register: pb.Register) -> Registration:
    """A generated Register (a test's, or one decoded along with something unexpected) as a record."""
    return _register(bytes(register))


def records(messages: Iterable[Any], kind: type[_R]) -> list[_R]:
    """Generated messages (a heartbeat's changed GPUs, weights, ...) as the records of kind."""
    schema = _SCHEMAS[kind]
    out = []
    for message in messages:
        data = bytes(message)
        out.append(kind(**_message(data, 0, len(data), schema)))
    return out


def _register(data: bytes) -> Registration:
    values: dict[str, Any] = {}
    lists: dict[str, list[Any]] = {}
    maps: dict[str, dict[str, str]] = {}
    for number, wire, value, start, end in _fields(data, 0, len(data)):
        field = _REGISTER.get(number)
        if field is None:
            continue
        name, kind, repeated = field
        if kind is dict:
            if wire != _LEN:
                raise _Unexpected(_wrong_wire(name, wire))
            key, item = _entry(data, start, end)
            maps.setdefault(name, {})[key] = item
        elif kind is pb.ShardStatus:
            if wire != _LEN:
                raise _Unexpected(_wrong_wire(name, wire))
            lists.setdefault(name, []).append(pb.ShardStatus.FromString(data[start:end]))
        elif isinstance(kind, type):
            if wire != _LEN:
                raise _Unexpected(_wrong_wire(name, wire))
            record = kind(**_message(data, start, end, _SCHEMAS[kind]))
            if repeated:
                lists.setdefault(name, []).append(record)
            else:
                # A message field sent twice: the last one, as the generated classes keep it.
                values[name] = record
        elif repeated:
            lists.setdefault(name, []).append(_scalar(name, kind, wire, value, data, start, end))
        else:
            values[name] = _scalar(name, kind, wire, value, data, start, end)
    for name, items in lists.items():
        values[name] = tuple(items)
    values.update(maps)
    return Registration(**values)


# --- the wire format ----------------------------------------------------------------------


def _message(data: bytes, at: int, end: int, schema: _Fields) -> dict[str, Any]:
    values: dict[str, Any] = {}
    lists: dict[str, list[str]] = {}
    for number, wire, value, start, stop in _fields(data, at, end):
        field = schema.get(number)
        if field is None:
            continue
        name, kind = field
        if kind is _STRS:
            lists.setdefault(name, []).append(_scalar(name, _STR, wire, value, data, start, stop))
        else:
            values[name] = _scalar(name, kind, wire, value, data, start, stop)
    for name, items in lists.items():
        values[name] = tuple(items)
    return values


def _entry(data: bytes, at: int, end: int) -> tuple[str, str]:
    """A map<string, string> entry: its key (1) and value (2)."""
    key = item = ""
    for number, wire, value, start, stop in _fields(data, at, end):
        if number == 1:
            key = _scalar("a map's key", _STR, wire, value, data, start, stop)
        elif number == 2:
            item = _scalar("a map's value", _STR, wire, value, data, start, stop)
    return key, item


def _wrong_wire(name: str, wire: int) -> str:
    return f"{name} is sent as protobuf wire type {wire}, not as the message its declaration says"


def _scalar(name: str, kind: str, wire: int, value: int, data: bytes, start: int, end: int) -> Any:
    if _WIRE[kind] != wire:
        declared = "a string" if kind in (_STR, _STRS) else f"an {kind}" if kind != _BOOL else "a bool"
        raise _Unexpected(f"{name} is sent as protobuf wire type {wire}, not as {declared}")
    if kind is _STR or kind is _STRS:
        try:
            text = data[start:end].decode()
        except UnicodeDecodeError:
            raise _Unexpected(f"{name} is not UTF-8 text") from None
        # One copy of what thousands of nodes repeat (GPU names, OS fields, CPU flags, label keys).
        return sys.intern(text)
    if kind is _BOOL:
        return value > 0
    bits = 32 if kind is _INT32 else 64
    value &= (1 << bits) - 1
    sign = 1 << (bits - 1)
    return (value ^ sign) - sign


_Field = tuple[int, int, int, int, int]


def _fields(data: bytes, at: int, end: int) -> list[_Field]:
    """(number, wire type, varint value, start, end) of each field of data[at:end]."""
    fields = []
    while at < end:
        tag, at = _varint(data, at, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise _Unexpected("a field numbered 0, which protobuf does not allow")
        if wire == _VARINT:
            value, at = _varint(data, at, end)
            fields.append((number, wire, value, at, at))
        elif wire == _LEN:
            length, at = _varint(data, at, end)
            if at + length > end:
                raise _Unexpected(f"field {number} is longer than what holds it")
            fields.append((number, wire, 0, at, at + length))
            at += length
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            if at + size > end:
                raise _Unexpected(f"field {number} is cut short")
            fields.append((number, wire, 0, at, at + size))
            at += size
        else:
            raise _Unexpected(f"field {number} has wire type {wire}, which proto3 does not use")
    return fields


def _varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while at < end and shift < 70:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise _Unexpected("a number is cut short or longer than 64 bits")
