"""The inventory: nodes, their replicas, and the routing table the gateway reads."""

from __future__ import annotations

import random

import pytest

from llmgw.control.inventory import READY, UNREACHABLE, Inventory, Node, NodeNotConnected
from llmgw.proto.llmgw import v1 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def status(
    shard_id: str, state: str, endpoint: str = "", model: str = "sim-chat", **kw: str
) -> pb.ShardStatus:
    return pb.ShardStatus(shard_id=shard_id, model=model, engine="sim", state=state, endpoint=endpoint, **kw)


def register(node_id: str, *running: pb.ShardStatus) -> pb.Register:
    return pb.Register(
        node_id=node_id, engine_versions={"sim": "1"}, engines_probed=True, running=list(running)
    )


class TestRouting:
    def test_a_ready_replica_on_a_ready_node_is_routed(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1"))
        inventory.shard_status("n1", status("s1", "starting"))
        assert inventory.ready_endpoints("sim-chat") == ()
        inventory.shard_status("n1", status("s1", "ready", "http://127.0.0.1:9001"))
        assert inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:9001",)

    def test_a_stopped_shard_leaves_the_inventory(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1", status("s1", "ready", "http://127.0.0.1:9001")))
        inventory.shard_status("n1", status("s1", "stopped"))
        assert inventory.replicas() == []
        assert inventory.ready_endpoints("sim-chat") == ()

    def test_a_silent_node_becomes_unreachable_and_its_replicas_stay_routed_until_the_gateway_finds_them_gone(
        self,
    ):
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        inventory.attach(register("n1", status("s1", "ready", "http://127.0.0.1:9001")))
        clock.now += 15
        assert inventory.expire() == []
        clock.now += 0.1
        assert inventory.expire() == ["n1"]
        assert inventory.node("n1").state == UNREACHABLE
        assert inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:9001",)
        inventory.engine_gone("s1", "sim on n1 did not answer the gateway's /health within 5 s")
        assert inventory.ready_endpoints("sim-chat") == ()

    def test_a_node_heard_from_again_is_ready_again(self):
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        inventory.attach(register("n1", status("s1", "ready", "http://127.0.0.1:9001")))
        clock.now += 20
        inventory.expire()
        inventory.heartbeat("n1", pb.Heartbeat(sequence=9))
        assert inventory.node("n1").state == READY
        assert inventory.ready_endpoints("sim-chat") == ("http://127.0.0.1:9001",)


class TestExpiry:
    def test_any_mix_of_beats_registrations_and_silences_expires_exactly_the_nodes_past_their_grace(self):
        rng = random.Random(21)
        for _ in range(30):
            clock = Clock()
            inventory = Inventory(grace_s=5, clock=clock)
            heard: dict[str, float] = {}
            unreachable: set[str] = set()
            for _ in range(300):
                node = f"n{rng.randrange(12)}"
                step = rng.random()
                if step < 0.15 or node not in heard:
                    inventory.attach(register(node))
                    heard[node] = clock.now
                    unreachable.discard(node)
                elif step < 0.6:
                    inventory.beat(node, None)
                    heard[node] = clock.now
                    unreachable.discard(node)
                elif step < 0.8:
                    clock.now += rng.choice([0.5, 1.0, 2.5, 5.0])
                else:
                    # What reading every node, as the sweep did, finds past the grace and not yet marked.
                    due = {n for n, at in heard.items() if clock.now - at > 5 and n not in unreachable}
                    assert sorted(inventory.expire()) == sorted(due)
                    unreachable |= due
                for name in heard:
                    state = inventory.node(name).state
                    assert state == (UNREACHABLE if name in unreachable else READY)

    def test_a_sweep_reads_only_the_nodes_past_their_grace_not_the_whole_fleet(self, monkeypatch):
        clock = Clock()
        inventory = Inventory(grace_s=5, clock=clock)
        for i in range(1000):
            inventory.attach(register(f"n{i}"))
        clock.now += 3
        for i in range(10, 1000):
            inventory.beat(f"n{i}", None)
        clock.now += 3
        slot = Node.__dict__["last_seen"]
        reads = []

        class Counted:
            def __get__(self, node: Node | None, owner: type) -> object:
                reads.append(node)
                return slot.__get__(node, owner)

            def __set__(self, node: Node, value: float) -> None:
                slot.__set__(node, value)

        monkeypatch.setattr(Node, "last_seen", Counted())
        assert inventory.expire() == [f"n{i}" for i in range(10)]
        # The ten silent ones, one to see where the heard ones begin, and the ten log lines' figures.
        assert len(reads) <= 21


class TestRegister:
    def test_register_adopts_the_shards_a_node_already_runs(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1", status("s1", "ready", "http://127.0.0.1:9001")))
        (replica,) = inventory.replicas("sim-chat")
        assert (replica.shard_id, replica.node_id, replica.state) == ("s1", "n1", "ready")

    def test_shards_a_reconnecting_node_no_longer_reports_are_forgotten(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1", status("s1", "ready", "http://127.0.0.1:9001")))
        inventory.expect("n1", pb.StartShard(shard_id="s2", model="sim-chat", engine="sim"))
        inventory.attach(register("n1", status("s1", "ready", "http://127.0.0.1:9001")))
        assert [r.shard_id for r in inventory.replicas()] == ["s1"]

    def test_a_heartbeat_saying_the_engines_changed_replaces_them(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1"))
        inventory.heartbeat("n1", pb.Heartbeat(engines_changed=True, engine_versions={}))
        assert inventory.node("n1").engine_versions == {}
        inventory.heartbeat("n1", pb.Heartbeat(sequence=2))
        assert inventory.node("n1").engine_versions == {}


class TestWhyNoReady:
    def test_it_says_what_each_replica_is_doing_and_where(self):
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        inventory.attach(register("n1"))
        inventory.attach(register("n2"))
        inventory.shard_status("n1", status("s1", "starting"))
        inventory.shard_status(
            "n2", status("s2", "downloading", detail="downloading model.gguf: 1.2 of 4.1 GB")
        )
        clock.now += 40
        # Progress of the same state is not a new state: the time counts from the first report.
        inventory.shard_status("n1", status("s1", "starting", detail="starting sim (pid 7) on port 20013"))
        assert inventory.why_no_ready("sim-chat") == (
            "sim-chat has no ready replica: starting on n1 for 40 s; "
            "downloading weights on n2: model.gguf: 1.2 of 4.1 GB"
        )

    def test_it_repeats_the_engine_s_last_words_for_a_failed_replica(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1"))
        inventory.shard_status("n1", status("s1", "failed", detail="exited with code 1"))
        assert inventory.why_no_ready("sim-chat") == (
            "sim-chat has no ready replica: failed on n1: exited with code 1"
        )

    def test_it_repeats_why_placement_could_not_place_the_model(self):
        inventory = Inventory(grace_s=15)
        inventory.set_unplaced("sim-chat", "no node can run it (no node has the sim engine)")
        assert inventory.why_no_ready("sim-chat") == (
            "sim-chat has no ready replica: no node can run it (no node has the sim engine)"
        )


async def test_a_message_for_a_node_goes_down_its_current_stream():
    inventory = Inventory(grace_s=15)
    link = inventory.attach(register("n1"))
    message = pb.ControlMessage(stop=pb.StopShard(shard_id="s1"))
    await inventory.send("n1", message)
    assert link.outbox.get_nowait() is message


async def test_sending_to_a_node_without_a_stream_says_so():
    inventory = Inventory(grace_s=15)
    inventory.detach(inventory.attach(register("n1")))
    with pytest.raises(NodeNotConnected, match="node n1 is not connected"):
        await inventory.send("n1", pb.ControlMessage(stop=pb.StopShard(shard_id="s1")))


class TestFailures:
    def _failed(self, detail: str, *output: str) -> pb.ShardStatus:
        return status("s1", "failed", detail=detail, last_output=list(output))

    def test_a_failure_is_kept_after_its_replica_is_forgotten(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1"))
        inventory.shard_status(
            "n1", self._failed("sim exited with code 1: error: bad model", "error: bad model")
        )
        inventory.forget("s1")
        [failure] = inventory.failures.recent("sim-chat")
        assert (failure.node_id, failure.reason, failure.last_output) == (
            "n1",
            "sim exited with code 1: error: bad model",
            ("error: bad model",),
        )
        assert inventory.failures.last("sim-chat", "n1") == failure

    def test_a_failure_repeated_when_its_node_reconnects_is_kept_once(self):
        inventory = Inventory(grace_s=15)
        failed = self._failed("sim exited with code 1", "bye")
        inventory.attach(register("n1"))
        inventory.shard_status("n1", failed)
        inventory.attach(register("n1", failed))
        inventory.shard_status("n1", failed)
        assert len(inventory.failures.recent()) == 1

    def test_an_engine_that_fails_again_after_a_restart_is_a_second_failure(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1"))
        inventory.shard_status("n1", self._failed("sim was killed by SIGKILL after serving", "one"))
        inventory.shard_status("n1", status("s1", "starting"))
        inventory.shard_status("n1", self._failed("sim was killed by SIGKILL after serving", "one", "two"))
        assert len(inventory.failures.recent()) == 2

    def test_only_the_last_five_per_model_and_node_are_kept(self):
        inventory = Inventory(grace_s=15)
        inventory.attach(register("n1"))
        inventory.attach(register("n2"))
        for i in range(7):
            inventory.shard_status("n1", status(f"a{i}", "failed", detail=f"failure {i}"))
        inventory.shard_status("n2", status("b0", "failed", detail="elsewhere"))
        assert [f.reason for f in inventory.failures.recent()] == [
            "elsewhere",
            *(f"failure {i}" for i in range(6, 1, -1)),
        ]


class TestFacts:
    """What placement reads of a node is read out of the messages once, and follows their changes."""

    def test_the_facts_are_read_once_until_the_node_reports_a_change(self) -> None:
        inventory = Inventory(15.0)
        gpu = pb.Gpu(index=0, gpu_class="h100-80g", healthy=True)
        reg = pb.Register(
            node_id="n1", gpus=[gpu], fabrics=[pb.Fabric(name="ib0")], memory=pb.Memory(total_mb=64)
        )
        inventory.attach(reg)
        node = inventory.node("n1")
        assert node is not None
        first = node.facts()
        assert (first.gpus, first.fabrics, first.memory_total_mb) == (
            ((0, "h100-80g", True, ""),),
            ("ib0",),
            64,
        )
        assert node.facts().gpus is first.gpus
        sick = pb.Gpu(index=0, gpu_class="h100-80g", healthy=False, unhealthy_reason="XID 79")
        inventory.heartbeat("n1", pb.Heartbeat(gpus_changed=True, gpus=[sick]))
        inventory.beat("n1", (128, 100))
        assert node.facts().gpus == ((0, "h100-80g", False, "XID 79"),)
        assert node.facts().memory_total_mb == 128
        inventory.heartbeat("n1", pb.Heartbeat(fabrics_changed=True, fabrics=[]))
        assert node.facts().fabrics == ()
