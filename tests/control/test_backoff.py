"""Backoff per model and node: a failing replica's node waits, doubling, while other nodes are tried."""

from __future__ import annotations

import betterproto

from llmgw.catalog import Catalog
from llmgw.config import ControlConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory, Link
from llmgw.control.placement import BACKOFF, Backoff, Scheduler
from llmgw.control.reconciler import MAX_BACKOFF_S, Reconciler
from llmgw.proto.llmgw import v1 as pb

SIM = ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])
OTHER = ModelConfig(name="other", replicas=1, profiles=[ProfileConfig(engine="sim")])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cfg(*models: ModelConfig) -> ServerConfig:
    return ServerConfig(models=list(models or [SIM]), control=ControlConfig(base_backoff_s=5.0))


def _node(inventory: Inventory, node_id: str) -> Link:
    return inventory.attach(pb.Register(node_id=node_id, engine_versions={"sim": "1"}, engines_probed=True))


def _sent(link: Link) -> list[tuple[str, pb.StartShard | pb.StopShard]]:
    out = []
    while not link.outbox.empty():
        out.append(betterproto.which_one_of(link.outbox.get_nowait(), "kind"))
    return out


def _status(shard_id: str, state: str, model: str = "sim-chat") -> pb.ShardStatus:
    return pb.ShardStatus(shard_id=shard_id, model=model, engine="sim", state=state, endpoint="http://x")


def _started(link: Link) -> pb.StartShard:
    (start,) = [m for k, m in _sent(link) if k == "start"]
    assert isinstance(start, pb.StartShard)
    return start


class TestBackoff:
    async def test_a_replica_that_fails_on_a_node_is_replaced_on_another_at_once(self):
        clock = Clock()
        inventory = Inventory(grace_s=15)
        n1, n2 = _node(inventory, "n1"), _node(inventory, "n2")
        inventory.shard_status("n1", _status("s1", "failed"))
        cfg = _cfg()
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=clock)
        await reconciler.reconcile()
        assert [kind for kind, _ in _sent(n1)] == ["stop"]
        assert _started(n2).model == "sim-chat"
        assert reconciler.backoff() == {("sim-chat", "n1"): Backoff(failures=1, remaining_s=5.0)}

    async def test_each_further_failure_on_the_same_node_doubles_its_wait(self):
        clock = Clock()
        inventory = Inventory(grace_s=15)
        n1 = _node(inventory, "n1")
        cfg = _cfg()
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=clock)
        inventory.shard_status("n1", _status("s0", "failed"))
        waits = []
        for failures in range(1, 5):
            await reconciler.reconcile()
            assert [kind for kind, _ in _sent(n1)] == ["stop"]
            wait = 5.0 * 2 ** (failures - 1)
            waits.append(wait)
            assert inventory.why_no_ready("sim-chat") == (
                f"sim-chat has no ready replica: no node can run it (node n1 is backing off after "
                f"{failures} failure{'s' if failures > 1 else ''} (next try in {wait:.0f} s))"
            )
            # Not a moment before its time...
            clock.now += wait - 0.5
            await reconciler.reconcile()
            assert _sent(n1) == []
            # ...and then tried again on the same node, where it fails once more.
            clock.now += 0.5
            await reconciler.reconcile()
            inventory.shard_status("n1", _status(_started(n1).shard_id, "failed"))
        assert waits == [5.0, 10.0, 20.0, 40.0]

    async def test_the_wait_stops_growing_at_its_ceiling(self):
        clock = Clock()
        inventory = Inventory(grace_s=15)
        _node(inventory, "n1")
        cfg = _cfg()
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=clock)
        for shard in range(12):
            inventory.shard_status("n1", _status(f"s{shard}", "failed"))
            await reconciler.reconcile()
            clock.now += MAX_BACKOFF_S
        assert reconciler.backoff() == {}
        inventory.shard_status("n1", _status("last", "failed"))
        await reconciler.reconcile()
        assert reconciler.backoff()[("sim-chat", "n1")].remaining_s == MAX_BACKOFF_S

    async def test_a_replica_that_serves_again_on_the_node_clears_its_backoff(self):
        clock = Clock()
        inventory = Inventory(grace_s=15)
        n1 = _node(inventory, "n1")
        cfg = _cfg()
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=clock)
        inventory.shard_status("n1", _status("s1", "failed"))
        await reconciler.reconcile()
        clock.now += 5.0
        await reconciler.reconcile()
        inventory.shard_status("n1", _status(_started(n1).shard_id, "ready"))
        await reconciler.reconcile()
        assert reconciler.backoff() == {}
        # The next failure there starts from the base wait again.
        inventory.shard_status("n1", _status("s2", "failed"))
        await reconciler.reconcile()
        assert reconciler.backoff() == {("sim-chat", "n1"): Backoff(failures=1, remaining_s=5.0)}

    async def test_the_backoff_is_for_that_model_only_another_still_goes_to_the_node(self):
        clock = Clock()
        inventory = Inventory(grace_s=15)
        n1 = _node(inventory, "n1")
        inventory.shard_status("n1", _status("s1", "failed"))
        cfg = _cfg(SIM, OTHER)
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=clock)
        await reconciler.reconcile()
        assert [(kind, getattr(m, "model", "")) for kind, m in _sent(n1)] == [
            ("stop", ""),
            ("start", "other"),
        ]

    async def test_the_first_retry_waits_on_the_node_even_when_another_model_was_placed_first_in_the_pass(
        self,
    ) -> None:
        """The pass's placement snapshot, taken for an earlier model, must see the later one's failure."""
        clock = Clock()
        inventory = Inventory(grace_s=15)
        n1 = _node(inventory, "n1")
        inventory.shard_status("n1", _status("s1", "failed"))
        cfg = _cfg(OTHER, SIM)
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=clock)
        await reconciler.reconcile()
        assert [(kind, getattr(m, "model", "")) for kind, m in _sent(n1)] == [
            ("stop", ""),
            ("start", "other"),
        ]
        clock.now += 4.9
        await reconciler.reconcile()
        assert _sent(n1) == []
        clock.now += 0.1
        await reconciler.reconcile()
        assert _started(n1).model == "sim-chat"


class TestPlacementSkipsABackingOffNode:
    def test_the_node_is_rejected_for_the_model_with_the_reason_and_others_remain(self):
        inventory = Inventory(grace_s=15)
        for node_id in ("n1", "n2"):
            _node(inventory, node_id)
        nodes = inventory.nodes()
        backoff = {("sim-chat", "n1"): Backoff(failures=3, remaining_s=19.6)}
        scheduler = Scheduler(nodes, [], [SIM, OTHER], backoff=backoff)
        verdicts = {v.node: v for v in scheduler.explain(SIM)}
        assert verdicts["n1"].kind == BACKOFF
        assert str(verdicts["n1"]) == (
            "node n1 is backing off after 3 failures (next try in 20 s) (profile default)"
        )
        assert verdicts["n2"].candidate
        placement = scheduler.place(SIM)
        assert placement is not None and placement.ranks[0].node == "n2"
        # The node set aside for sim-chat is still there for other models.
        other = scheduler.place(OTHER)
        assert other is not None and other.ranks[0].node == "n1"

    def test_with_every_node_backing_off_the_model_says_so(self):
        inventory = Inventory(grace_s=15)
        for node_id in ("n1", "n2"):
            _node(inventory, node_id)
        backoff = {("sim-chat", n): Backoff(failures=1, remaining_s=5.0) for n in ("n1", "n2")}
        scheduler = Scheduler(inventory.nodes(), [], [SIM], backoff=backoff)
        assert scheduler.place(SIM) is None
        assert (
            scheduler.why_not(SIM)
            == "no node can run it (node n1 is backing off after 1 failure (next try in 5 s), "
            "node n2 is backing off after 1 failure (next try in 5 s))"
        )


class TestWhyEachNodeIsBackingOff:
    def test_each_node_backing_off_is_named_with_why_the_model_last_failed_there(self):
        nodes = _nodes_backing_off(2)
        causes = {"n1": "sim exited with code 1: error: out of memory", "n2": "port 20013 is in use"}
        backoff = {("sim-chat", n): Backoff(failures=1, remaining_s=5.0, cause=c) for n, c in causes.items()}
        scheduler = Scheduler(nodes.nodes(), [], [SIM], backoff=backoff)
        assert scheduler.why_not(SIM) == (
            "no node can run it (node n1 is backing off after 1 failure (next try in 5 s): "
            "sim exited with code 1: error: out of memory, node n2 is backing off after 1 failure "
            "(next try in 5 s): port 20013 is in use)"
        )

    def test_past_three_nodes_backing_off_the_rest_are_counted(self):
        nodes = _nodes_backing_off(5)
        backoff = {("sim-chat", f"n{i}"): Backoff(failures=1, remaining_s=5.0) for i in range(1, 6)}
        why = Scheduler(nodes.nodes(), [], [SIM], backoff=backoff).why_not(SIM)
        assert why.count("is backing off") == 3
        assert why.endswith(", 2 more nodes are backing off after failures of this model)")

    async def test_the_reconcilers_backoff_carries_the_cause_the_node_reported(self):
        inventory = Inventory(grace_s=15)
        _node(inventory, "n1")
        inventory.shard_status(
            "n1",
            pb.ShardStatus(
                shard_id="s1",
                model="sim-chat",
                engine="sim",
                state="failed",
                detail="sim exited with code 1: error: bad model",
            ),
        )
        cfg = _cfg()
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=Clock())
        await reconciler.reconcile()
        assert reconciler.backoff() == {
            ("sim-chat", "n1"): Backoff(
                failures=1, remaining_s=5.0, cause="sim exited with code 1: error: bad model"
            )
        }


def _nodes_backing_off(count: int) -> Inventory:
    inventory = Inventory(grace_s=15)
    for i in range(1, count + 1):
        _node(inventory, f"n{i}")
    return inventory
