"""A profile failing on a node the same way again and again is no longer placed there; explain says so."""

from __future__ import annotations

import betterproto

from llmgw.catalog import Catalog
from llmgw.config import ControlConfig, ServerConfig
from llmgw.control.failures import GIVE_UP_AFTER, PROVEN_S
from llmgw.control.inventory import Inventory, Link
from llmgw.control.placement import GIVEN_UP, Scheduler
from llmgw.control.reconciler import Reconciler
from llmgw.proto.llmgw import v1 as pb

# What the agent says of vLLM that answered /health, then died at its first request.
DIED = (
    "vllm exited with code 1 after serving: Unsupported CPU attention configuration: head_dim=16 "
    "is not supported"
)
MODEL = """
name: tiny
profiles:
  - {name: cpu, engine: sim}
"""
TWO_PROFILES = """
name: tiny
profiles:
  - {name: cpu, engine: sim}
  - {name: other, engine: sim}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    """A reconciler over an inventory of sim nodes, on clocks the test moves."""

    def __init__(self, *nodes: str) -> None:
        self.clock = Clock()
        self.inventory = Inventory(grace_s=15, clock=self.clock)
        self.links = {node: self.attach(node) for node in nodes}
        self.cfg = ServerConfig(control=ControlConfig(base_backoff_s=5.0))
        self.catalog = Catalog(self.cfg)
        self.reconciler = Reconciler(self.cfg, self.inventory, self.catalog, in_flight={}, clock=self.clock)

    def attach(self, node: str) -> Link:
        register = pb.Register(node_id=node, engine_versions={"sim": "1"}, engines_probed=True)
        link = self.inventory.attach(register)
        if hasattr(self, "links"):
            self.links[node] = link
        return link

    def started(self, node: str) -> list[pb.StartShard]:
        link, out = self.links[node], []
        while not link.outbox.empty():
            kind, message = betterproto.which_one_of(link.outbox.get_nowait(), "kind")
            if kind == "start":
                assert isinstance(message, pb.StartShard)
                out.append(message)
        return out

    def report(self, node: str, start: pb.StartShard, state: str, detail: str = "") -> None:
        status = pb.ShardStatus(
            shard_id=start.shard_id,
            model=start.model,
            engine=start.engine,
            profile=start.profile,
            state=state,
            endpoint="http://x",
            detail=detail,
        )
        self.inventory.shard_status(node, status)

    async def serve_then_die(self, node: str, detail: str = DIED, served_s: float = 1.0) -> pb.StartShard:
        """Wait out the node's backoff, see a replica placed there, ready, then failed with detail."""
        self.clock.now += 3600
        await self.reconciler.reconcile()
        (start,) = self.started(node)
        self.report(node, start, "ready")
        self.clock.now += served_s
        self.report(node, start, "failed", detail)
        await self.reconciler.reconcile()
        return start

    def verdicts(self) -> list[str]:
        model = self.catalog.get("tiny")
        assert model is not None
        scheduler = Scheduler.for_inventory(
            self.inventory, self.cfg, self.catalog.models(), self.reconciler.backoff()
        )
        return [str(v) for v in scheduler.explain(model)]


async def test_a_profile_that_dies_the_same_way_three_times_is_no_longer_placed_on_the_node() -> None:
    fleet = Fleet("n1")
    await fleet.catalog.add(MODEL, "test")
    for _ in range(GIVE_UP_AFTER):
        await fleet.serve_then_die("n1")
    # However long it waits, the node is not given the profile again...
    fleet.clock.now += 3600
    await fleet.reconciler.reconcile()
    assert fleet.started("n1") == []
    # ...and explain, the 503 and the metrics say why, in the node's words.
    (verdict,) = fleet.verdicts()
    assert verdict == (
        f"node n1 is given up for this profile: its replica failed there the same way 3 times in a row "
        f"({DIED}); it is tried there again once the model's definition changes or the node's agent "
        "registers again (profile cpu)"
    )
    assert "is given up for this profile" in fleet.inventory.why_no_ready("tiny")
    assert fleet.reconciler._metrics.placement_failures.labels("tiny", GIVEN_UP)._value.get() >= 1


async def test_another_profile_of_the_model_is_still_tried_on_that_node() -> None:
    fleet = Fleet("n1")
    await fleet.catalog.add(TWO_PROFILES, "test")
    for _ in range(GIVE_UP_AFTER):
        start = await fleet.serve_then_die("n1")
        assert start.profile == "cpu"
    fleet.clock.now += 3600
    await fleet.reconciler.reconcile()
    assert [s.profile for s in fleet.started("n1")] == ["other"]


async def test_failures_in_different_words_do_not_give_the_profile_up() -> None:
    fleet = Fleet("n1")
    await fleet.catalog.add(MODEL, "test")
    for n in range(GIVE_UP_AFTER * 2):
        await fleet.serve_then_die("n1", detail=[DIED, "vllm was killed by SIGKILL after serving"][n % 2])
    fleet.clock.now += 3600
    await fleet.reconciler.reconcile()
    assert len(fleet.started("n1")) == 1


async def test_failures_that_differ_only_in_their_numbers_are_the_same_failure() -> None:
    fleet = Fleet("n1")
    await fleet.catalog.add(MODEL, "test")
    for n in range(GIVE_UP_AFTER):
        stalled = f"stalled, so its process group was killed: sim on n1 stopped answering /health {n} s ago"
        await fleet.serve_then_die("n1", detail=stalled)
    fleet.clock.now += 3600
    await fleet.reconciler.reconcile()
    assert fleet.started("n1") == []
    (verdict,) = fleet.verdicts()
    # The last one's words, as they were.
    assert "stopped answering /health 2 s ago" in verdict


async def test_a_replica_that_served_for_long_before_failing_starts_no_count() -> None:
    fleet = Fleet("n1")
    await fleet.catalog.add(MODEL, "test")
    for _ in range(GIVE_UP_AFTER):
        await fleet.serve_then_die("n1", served_s=PROVEN_S)
    fleet.clock.now += 3600
    await fleet.reconciler.reconcile()
    assert len(fleet.started("n1")) == 1


async def test_a_changed_model_definition_is_tried_again_on_the_node() -> None:
    fleet = Fleet("n1")
    await fleet.catalog.add(MODEL, "test")
    for _ in range(GIVE_UP_AFTER):
        await fleet.serve_then_die("n1")
    await fleet.catalog.add(MODEL.replace("engine: sim", "engine: sim, args: [--dtype, float32]"), "test")
    fleet.clock.now += 3600
    await fleet.reconciler.reconcile()
    assert len(fleet.started("n1")) == 1


async def test_a_node_whose_agent_registers_again_is_tried_again() -> None:
    fleet = Fleet("n1")
    await fleet.catalog.add(MODEL, "test")
    for _ in range(GIVE_UP_AFTER):
        await fleet.serve_then_die("n1")
    fleet.attach("n1")
    fleet.clock.now += 3600
    await fleet.reconciler.reconcile()
    assert len(fleet.started("n1")) == 1


async def test_a_model_removed_and_added_again_is_tried_again_on_the_node() -> None:
    fleet = Fleet("n1")
    await fleet.catalog.add(MODEL, "test")
    for _ in range(GIVE_UP_AFTER):
        await fleet.serve_then_die("n1")
    await fleet.catalog.remove("tiny")
    await fleet.reconciler.reconcile()
    await fleet.catalog.add(MODEL, "test")
    fleet.clock.now += 3600
    await fleet.reconciler.reconcile()
    assert len(fleet.started("n1")) == 1
