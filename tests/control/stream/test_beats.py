"""Plain heartbeats read by hand mean exactly what the generated classes read from the same bytes."""

from __future__ import annotations

import random

import betterproto
import pytest

from llmgw.control.stream.beats import Beat, decode
from llmgw.proto.llmgw import v1 as pb

EDGES = [0, 1, 127, 128, 300, 2**31 - 1, 2**31, 2**62, 2**63 - 1, -1, -(2**63)]


def _beats(rng: random.Random) -> list[pb.Heartbeat]:
    beats = [pb.Heartbeat(), pb.Heartbeat(memory=pb.Memory())]
    for sequence in EDGES:
        beats.append(pb.Heartbeat(sequence=sequence))
        memory = pb.Memory(total_mb=sequence, available_mb=-sequence)
        beats.append(pb.Heartbeat(sequence=sequence, memory=memory))
    for _ in range(300):
        total = rng.choice([*EDGES, rng.randrange(1 << 40)])
        memory = pb.Memory(total_mb=total, available_mb=rng.randrange(1 << 20))
        beats.append(pb.Heartbeat(sequence=rng.randrange(1 << 33), memory=memory))
    return beats


def test_a_plain_heartbeat_reads_as_the_generated_classes_read_it():
    for beat in _beats(random.Random(21)):
        data = bytes(pb.AgentMessage(heartbeat=beat))
        read = decode(data)
        assert isinstance(read, Beat), data
        generated = pb.AgentMessage.FromString(data).heartbeat
        assert read.sequence == generated.sequence
        if betterproto.serialized_on_wire(generated.memory):
            assert read.memory == (generated.memory.total_mb, generated.memory.available_mb)
        else:
            assert read.memory is None


@pytest.mark.parametrize(
    "message",
    [
        pb.AgentMessage(shard=pb.ShardStatus(shard_id="s1", state="ready")),
        pb.AgentMessage(heartbeat=pb.Heartbeat(sequence=3, gpus_changed=True)),
        pb.AgentMessage(
            heartbeat=pb.Heartbeat(sequence=3, weights_changed=True, weights=[pb.Weights(source="x")])
        ),
        pb.AgentMessage(heartbeat=pb.Heartbeat(warnings_changed=True, memory=pb.Memory(total_mb=1))),
        pb.AgentMessage(heartbeat=pb.Heartbeat(fabrics_changed=True, fabrics=[pb.Fabric(name="ib0")])),
    ],
)
def test_a_message_that_says_more_than_a_plain_heartbeat_goes_to_the_generated_classes(message):
    data = bytes(message)
    assert decode(data) == pb.AgentMessage.FromString(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\x12\x02\x08",  # the sequence's varint cut short
        b"\x12\x05\x08\x01",  # a heartbeat longer than the message
        b"\x12\x02\x08\x01\x08\x02",  # a sequence repeated
        b"\x12\x04\x12\x02\x08\x01\x10",  # memory's length beyond the heartbeat
        b"\x12\x04\x12\x02\x18\x01",  # a field Memory does not have
        b"\x12\x0b\x08" + b"\xff" * 9 + b"\x7f",  # a varint wider than 64 bits
        b"\x12\x02\x08\x01\x12\x00",  # bytes after the heartbeat
    ],
)
def test_bytes_the_hand_reader_does_not_expect_are_left_to_the_generated_classes(data):
    try:
        expected: object = pb.AgentMessage.FromString(data)
    # Whatever betterproto raises, the hand reader must raise too.
    except Exception as exc:
        with pytest.raises(type(exc)):
            decode(data)
        return
    read = decode(data)
    assert not isinstance(read, Beat)
    assert read == expected
