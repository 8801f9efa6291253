"""Heartbeats and Registers read by hand mean exactly what the generated classes read from the same bytes."""

from __future__ import annotations

import gc
import random
import sys
import types

import betterproto
import pytest

from llmgw.control import records
from llmgw.control.inventory import Inventory
from llmgw.control.records import Registration
from llmgw.control.stream.wire import Beat, decode, read_register
from llmgw.proto.llmgw import v1 as pb

EDGES = [0, 1, 127, 128, 300, 2**31 - 1, 2**31, 2**32 + 5, 2**62, 2**63 - 1, -1, -(2**31), -(2**63)]
TEXT = ["", "a", "NVIDIA H100 80GB HBM3", "zürich-ß", "日本語", "x" * 300]


def _expected(message: pb.Register) -> Registration:
    """What the generated classes read, as the record: built from their attributes, not from bytes."""

    def on_wire(value: betterproto.Message) -> bool:
        return betterproto.serialized_on_wire(value)

    return Registration(
        node_id=message.node_id,
        agent_version=message.agent_version,
        gpus=tuple(
            records.Gpu(
                g.index,
                g.uuid,
                g.name,
                g.gpu_class,
                g.memory_total_mb,
                g.memory_used_mb,
                g.healthy,
                g.unhealthy_reason,
            )
            for g in message.gpus
        ),
        memory=records.Memory(message.memory.total_mb, message.memory.available_mb)
        if on_wire(message.memory)
        else None,
        engine_versions=dict(message.engine_versions),
        running=tuple(message.running),
        weights=tuple(
            records.Weights(w.source, w.path, w.size_bytes, w.sha256, w.in_use) for w in message.weights
        ),
        labels=dict(message.labels),
        fabrics=tuple(records.Fabric(f.name, tuple(f.hcas)) for f in message.fabrics),
        heartbeat_interval_ms=message.heartbeat_interval_ms,
        storage=tuple(records.Storage(s.path, s.total_bytes, s.free_bytes) for s in message.storage),
        host=records.Host(
            message.host.os_id,
            message.host.os_version,
            message.host.os_codename,
            message.host.arch,
            tuple(message.host.cpu_flags),
            message.host.nvidia_driver,
            message.host.family,
            tuple(message.host.id_like),
        )
        if on_wire(message.host)
        else None,
        engines_probed=message.engines_probed,
        provision=tuple(
            records.ProvisionStatus(p.engine, p.version, p.variant, p.state, p.detail, p.next_try_s)
            for p in message.provision
        ),
        warnings=tuple(message.warnings),
        advertise_address=message.advertise_address,
        fabric_address=message.fabric_address,
    )


def _gpu_node(node_id: str, index: int = 0) -> pb.Register:
    """A GPU node's Register as an agent sends it (the benchmark's, scripts/fleet_nodes.py)."""
    return pb.Register(
        node_id=node_id,
        agent_version="0.1.0",
        gpus=[
            pb.Gpu(
                index=g,
                uuid=f"GPU-{index:05d}-{g}",
                name="NVIDIA H100 80GB HBM3",
                gpu_class="h100-80g",
                memory_total_mb=81559,
                healthy=True,
            )
            for g in range(8)
        ],
        memory=pb.Memory(total_mb=2_000_000, available_mb=1_800_000),
        engine_versions={"llamacpp": "b6500", "vllm": "0.11.0"},
        engines_probed=True,
        heartbeat_interval_ms=5000,
        storage=[pb.Storage(path="/var/lib/llmgw-agent", total_bytes=4 << 40, free_bytes=3 << 40)],
        host=pb.Host(
            os_id="ubuntu",
            os_version="24.04",
            os_codename="noble",
            arch="amd64",
            cpu_flags=["avx2", "avx512f"],
            nvidia_driver="570.86.15",
            family="deb",
            id_like=["debian"],
        ),
        weights=[
            pb.Weights(
                source=f"hf://org/model-{w}", path=f"/w/model-{w}", size_bytes=w << 32, sha256="ab" * 32
            )
            for w in range(3)
        ],
        labels={"zone": "eu", "rack": f"r{index // 40}"},
        fabrics=[pb.Fabric(name="ib-0", hcas=["mlx5_0", "mlx5_1"])],
        advertise_address="10.0.0.1",
    )


def _random_register(rng: random.Random) -> pb.Register:
    def number() -> int:
        return rng.choice([*EDGES, rng.randrange(-(1 << 40), 1 << 40)])

    def int32() -> int:
        return rng.choice([0, 1, -1, 2**31 - 1, -(2**31), rng.randrange(-(2**31), 2**31)])

    def text() -> str:
        return rng.choice([*TEXT, f"t{rng.randrange(1000)}"])

    def some(make, most: int = 3):  # type: ignore[no-untyped-def]
        return [make() for _ in range(rng.randrange(most + 1))]

    fields = dict(
        node_id=text(),
        agent_version=text(),
        gpus=some(
            lambda: pb.Gpu(
                index=int32(),
                uuid=text(),
                name=text(),
                gpu_class=text(),
                memory_total_mb=number(),
                memory_used_mb=number(),
                healthy=rng.random() < 0.5,
                unhealthy_reason=text(),
            )
        ),
        engine_versions={text(): text() for _ in range(rng.randrange(3))},
        running=some(lambda: pb.ShardStatus(shard_id=text(), state="ready", gpu_indices=[1, 2], pid=7), 1),
        weights=some(
            lambda: pb.Weights(
                source=text(), path=text(), size_bytes=number(), sha256=text(), in_use=rng.random() < 0.5
            )
        ),
        labels={text(): text() for _ in range(rng.randrange(3))},
        fabrics=some(lambda: pb.Fabric(name=text(), hcas=some(text))),
        heartbeat_interval_ms=int32(),
        storage=some(lambda: pb.Storage(path=text(), total_bytes=number(), free_bytes=number())),
        engines_probed=rng.random() < 0.5,
        provision=some(
            lambda: pb.ProvisionStatus(
                engine=text(),
                version=text(),
                variant=text(),
                state=text(),
                detail=text(),
                # Absent, or any int32: 0 ("now") is not absent.
                next_try_s=rng.choice([None, int32()]),
            )
        ),
        warnings=some(text),
        advertise_address=text(),
        fabric_address=text(),
    )
    message = pb.Register(**fields)
    if rng.random() < 0.7:
        message.memory = pb.Memory(total_mb=number(), available_mb=number())
    if rng.random() < 0.7:
        message.host = pb.Host(
            os_id=text(),
            os_version=text(),
            os_codename=text(),
            arch=text(),
            cpu_flags=some(text),
            nvidia_driver=text(),
            family=text(),
            id_like=some(text),
        )
    return message


def _agent_message(register: bytes) -> bytes:
    return (
        bytes(pb.AgentMessage(register=pb.Register()))
        if not register
        else b"\x0a" + _len(register) + register
    )


def _len(data: bytes) -> bytes:
    out, value = bytearray(), len(data)
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class TestSameMeaning:
    def test_a_gpu_nodes_register_reads_as_the_generated_classes_read_it(self):
        data = bytes(_gpu_node("n1"))
        assert read_register(data) == _expected(pb.Register.FromString(data))

    def test_random_registers_read_as_the_generated_classes_read_them(self):
        rng = random.Random(21)
        for _ in range(300):
            data = bytes(_random_register(rng))
            assert read_register(data) == _expected(pb.Register.FromString(data)), data

    def test_two_registers_one_after_the_other_read_as_one_with_both_fields(self):
        # Repeated fields add up, maps merge, and a field sent twice keeps its last value.
        rng = random.Random(5)
        for _ in range(50):
            data = bytes(_random_register(rng)) + bytes(_random_register(rng))
            assert read_register(data) == _expected(pb.Register.FromString(data)), data

    def test_fields_the_declaration_does_not_know_are_skipped(self):
        unknown = (
            b"\xc8\x01\x05"  # field 25, a varint
            b"\xd2\x01\x03abc"  # field 26, length-delimited
            b"\xdd\x01\x01\x02\x03\x04"  # field 27, fixed32
            b"\xe1\x01" + bytes(8)  # field 28, fixed64
        )
        data = bytes(_gpu_node("n1")) + unknown
        assert read_register(data) == _expected(pb.Register.FromString(data))

    def test_an_agent_message_of_only_a_register_decodes_to_the_record(self):
        data = bytes(pb.AgentMessage(register=_gpu_node("n1")))
        assert decode(data) == _expected(_gpu_node("n1"))

    def test_an_empty_register_is_a_register_of_nothing(self):
        assert decode(b"\x0a\x00") == Registration()

    def test_a_register_is_read_without_the_generated_classes(self, monkeypatch):
        def refuse(data: bytes) -> None:
            raise AssertionError("the generated classes decoded a plain Register")

        monkeypatch.setattr(pb.Register, "FromString", refuse)
        monkeypatch.setattr(pb.AgentMessage, "FromString", refuse)
        assert decode(bytes(pb.AgentMessage(register=_gpu_node("n1")))).node_id == "n1"


@pytest.mark.parametrize(
    "register",
    [
        b"\x0a\x05n1",  # node_id longer than the message
        b"\x0a\x02\xff\xfe",  # a node_id that is not UTF-8
        b"\x08\x01",  # node_id sent as a varint
        b"\x1a\x03\x08\x01",  # a GPU longer than the message
        b"\x1a\x02\x0a\x01",  # a GPU's index sent as a string
        b"\x22\x02\x08",  # memory's varint cut short
        b"\x50" + b"\xff" * 10 + b"\x01",  # a varint wider than 70 bits
        b"\x2a\x04\x0a\x02\xc3\x28",  # a map key that is not UTF-8
        b"\x0f",  # a wire type protobuf does not have
        b"\x00\x01",  # field number 0
        b"\x1a\x02\x10",  # a GPU's uuid cut short
    ],
)
def test_bytes_that_are_no_register_are_refused_as_the_generated_classes_refuse_them(register):
    data = _agent_message(register)
    try:
        pb.AgentMessage.FromString(data)
    # Whatever betterproto raises, the hand reader must raise too.
    except Exception as exc:
        with pytest.raises(type(exc)):
            decode(data)
        return
    # The generated classes read these into a field of the wrong type (an int for a node id):
    # refused, with what is wrong, rather than kept.
    with pytest.raises(ValueError, match=r"cannot read a node's Register: .+"):
        decode(data)


class TestWhatANodeKeeps:
    def test_a_registered_node_keeps_no_generated_message(self):
        inventory = Inventory(15.0)
        inventory.attach(read_register(bytes(_gpu_node("n1"))))
        node = inventory.node("n1")
        seen: set[int] = set()
        todo: list[object] = [node]
        while todo:
            item = todo.pop()
            if id(item) in seen or isinstance(item, type):
                continue
            seen.add(id(item))
            assert not isinstance(item, betterproto.Message), item
            todo.extend(gc.get_referents(item))

    def test_a_gpu_node_costs_the_inventory_a_few_kilobytes(self):
        # What the inventory holds of each of a thousand nodes (their Node and stream link, the
        # records of their GPUs, disks, weights and host), counting once what nodes share: under
        # 6 KB (about 4.6). With the generated messages, asyncio's queue and its event: about 13 KB.
        inventory = Inventory(15.0)
        ids = [f"n{i:04d}" for i in range(1000)]
        for i, node_id in enumerate(ids):
            inventory.attach(read_register(bytes(_gpu_node(node_id, i))))
        held = [inventory.node(node_id) for node_id in ids] + [inventory._links[node_id] for node_id in ids]
        per_node = _size(held) / len(ids)
        assert per_node < 6144, per_node


def _size(roots: list[object]) -> int:
    """Bytes of every object reachable from roots, each counted once (classes and functions aside)."""
    seen: set[int] = set()
    total = 0
    todo = list(roots)
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        todo.extend(gc.get_referents(item))
    return total


# --- plain heartbeats ---------------------------------------------------------------------

BEAT_EDGES = [0, 1, 127, 128, 300, 2**31 - 1, 2**31, 2**62, 2**63 - 1, -1, -(2**63)]


def _beats(rng: random.Random) -> list[pb.Heartbeat]:
    beats = [pb.Heartbeat(), pb.Heartbeat(memory=pb.Memory())]
    for sequence in BEAT_EDGES:
        beats.append(pb.Heartbeat(sequence=sequence))
        memory = pb.Memory(total_mb=sequence, available_mb=-sequence)
        beats.append(pb.Heartbeat(sequence=sequence, memory=memory))
    for _ in range(300):
        total = rng.choice([*BEAT_EDGES, rng.randrange(1 << 40)])
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
