"""Minimal placement: missing replicas are started on the least loaded capable node, failed ones replaced."""

from __future__ import annotations

import betterproto

from llmgw.catalog import Catalog
from llmgw.config import ControlConfig, EndpointConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory, Link
from llmgw.control.reconciler import Reconciler
from llmgw.proto.llmgw import v1 as pb


def server_config(*models: ModelConfig, base_backoff_s: float = 60.0) -> ServerConfig:
    return ServerConfig(models=list(models), control=ControlConfig(base_backoff_s=base_backoff_s))


def model(name: str = "sim-chat", replicas: int = 1, *engines: str) -> ModelConfig:
    profiles = [ProfileConfig(engine=e, args=["--ttft-ms", "0"]) for e in engines or ("sim",)]
    return ModelConfig(name=name, replicas=replicas, profiles=profiles)


def node(inventory: Inventory, node_id: str, *running: pb.ShardStatus, engines=("sim",)) -> Link:
    return inventory.attach(
        pb.Register(
            node_id=node_id,
            engine_versions={e: "1" for e in engines},
            engines_probed=True,
            running=list(running),
        )
    )


def ready(shard_id: str, model: str = "sim-chat") -> pb.ShardStatus:
    return pb.ShardStatus(shard_id=shard_id, model=model, engine="sim", state="ready", endpoint="http://x")


def failed(shard_id: str) -> pb.ShardStatus:
    return pb.ShardStatus(shard_id=shard_id, model="sim-chat", engine="sim", state="failed")


def sent(link: Link) -> list[tuple[str, object]]:
    out = []
    while not link.outbox.empty():
        out.append(betterproto.which_one_of(link.outbox.get_nowait(), "kind"))
    return out


async def test_a_missing_replica_is_started_on_the_node_with_fewest_replicas():
    inventory = Inventory(grace_s=15)
    busy = node(inventory, "n1", ready("other-1", "other"))
    idle = node(inventory, "n2")
    cfg = server_config(model(), model("other"))
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    assert sent(busy) == []
    ((kind, start),) = sent(idle)
    assert kind == "start"
    assert (start.model, start.engine, start.args) == ("sim-chat", "sim", ["--ttft-ms", "0"])
    assert inventory.why_no_ready("sim-chat").startswith("sim-chat has no ready replica: starting on n2 for ")


async def test_a_replica_asked_for_is_not_asked_for_again_before_the_node_answers():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1")
    cfg = server_config(model())
    reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={})
    await reconciler.reconcile()
    await reconciler.reconcile()
    assert [kind for kind, _ in sent(link)] == ["start"]


async def test_a_node_without_the_engine_is_not_a_candidate():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1", engines=("llamacpp",))
    cfg = server_config(model())
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    assert sent(link) == []
    assert inventory.why_no_ready("sim-chat") == (
        "sim-chat has no ready replica: no node can run it (no node has the sim engine)"
    )


async def test_with_no_node_connected_the_model_says_so():
    inventory = Inventory(grace_s=15)
    cfg = server_config(model())
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    assert inventory.why_no_ready("sim-chat") == (
        "sim-chat has no ready replica: no node can run it (no node is connected)"
    )


async def test_a_failed_replica_is_stopped_and_replaced():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1")
    other = node(inventory, "n2")
    inventory.shard_status(
        "n1", pb.ShardStatus(shard_id="s1", model="sim-chat", engine="sim", state="failed")
    )
    cfg = server_config(model())
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    ((kind, stop),) = sent(link)
    assert kind == "stop" and stop.shard_id == "s1"
    ((kind, start),) = sent(other)
    assert kind == "start" and start.shard_id != "s1"


async def test_a_model_that_fails_on_its_only_node_waits_before_its_next_try():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1")
    cfg = server_config(model(), base_backoff_s=60)
    reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=lambda: 100.0)
    inventory.shard_status("n1", failed("s1"))
    await reconciler.reconcile()
    assert [kind for kind, _ in sent(link)] == ["stop"]
    assert inventory.why_no_ready("sim-chat") == (
        "sim-chat has no ready replica: no node can run it "
        "(node n1 is backing off after 1 failure (next try in 60 s))"
    )


async def test_a_failure_that_arrives_while_a_pass_places_an_earlier_model_is_not_placed_back_on_its_node():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1", ready("s1"))
    # Placeable nowhere, and first in the catalog: the pass reaches it before sim-chat.
    cfg = server_config(model("big", 1, "vllm"), model())

    class FailsMidPass(Reconciler):
        async def _reconcile_model(self, model: ModelConfig) -> None:
            if model.name == "big":
                # The node's word that s1 failed, handed on while the pass is busy with "big".
                inventory.shard_status("n1", failed("s1"))
            await super()._reconcile_model(model)

    await FailsMidPass(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    assert [kind for kind, _ in sent(link)] == ["stop"]
    assert "backing off" in inventory.why_no_ready("sim-chat")


async def test_replicas_beyond_the_wanted_count_are_stopped():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1", ready("s1"), ready("s2"))
    cfg = server_config(model(replicas=1))
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    assert [kind for kind, _ in sent(link)] == ["stop"]
    assert len(inventory.replicas("sim-chat")) == 1


async def test_a_replica_on_an_unreachable_node_is_replaced_elsewhere():
    clock = [0.0]
    inventory = Inventory(grace_s=15, clock=lambda: clock[0])
    node(inventory, "n1", ready("s1"))
    clock[0] = 10.0
    n2 = node(inventory, "n2")
    clock[0] = 20.0
    assert inventory.expire() == ["n1"]
    cfg = server_config(model())
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    assert [kind for kind, _ in sent(n2)] == ["start"]


async def test_shards_of_a_model_no_longer_in_the_catalog_are_stopped():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1", ready("gone-1", "gone"))
    cfg = server_config()
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    ((kind, stop),) = sent(link)
    assert (kind, stop.shard_id, stop.reason) == ("stop", "gone-1", "gone is no longer in the catalog")


async def test_a_model_served_by_endpoints_is_never_placed_and_its_old_replicas_are_stopped():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1", ready("sim-chat-1"))
    outside = ModelConfig(name="sim-chat", endpoints=[EndpointConfig(url="http://10.1.2.3:8000/v1")])
    cfg = server_config(outside)
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    ((kind, stop),) = sent(link)
    assert (kind, stop.shard_id, stop.reason) == (
        "stop",
        "sim-chat-1",
        "sim-chat is now served by its endpoints",
    )


async def test_the_first_profile_some_node_can_run_is_used():
    inventory = Inventory(grace_s=15)
    link = node(inventory, "n1", engines=("sim",))
    cfg = server_config(model("sim-chat", 1, "llamacpp", "sim"))
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    ((_, start),) = sent(link)
    assert start.engine == "sim"
