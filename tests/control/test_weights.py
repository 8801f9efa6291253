"""Weights collection: nodes are asked to remove only weights no model uses and no engine has open."""

from __future__ import annotations

import betterproto

from llmgw.adminapi.weights import collect_weights, plan_collection, wanted_sources
from llmgw.config import ModelConfig, ProfileConfig
from llmgw.control.inventory import Inventory
from llmgw.control.localfiles import key_of
from llmgw.proto.llmgw import v1 as pb

USED, OPEN, STALE = "http://m/used.gguf", "http://m/open.gguf", "http://m/stale.gguf"


def _inventory() -> tuple[Inventory, object]:
    inventory = Inventory(grace_s=10)
    link = inventory.attach(
        pb.Register(
            node_id="n1",
            weights=[
                pb.Weights(source=USED),
                pb.Weights(source=OPEN, in_use=True),
                pb.Weights(source=STALE),
            ],
        )
    )
    return inventory, link


def test_collect_keeps_what_the_catalog_names_and_what_an_engine_has_open() -> None:
    inventory, _ = _inventory()
    (plan,) = plan_collection(inventory, {USED})
    assert plan.removing == [STALE]
    assert plan.kept == [f"{USED} (a model in the catalog uses it)", f"{OPEN} (an engine on n1 uses it)"]


async def test_collect_sends_the_node_a_remove_weights_for_the_rest() -> None:
    inventory, link = _inventory()
    (done,) = await collect_weights(inventory, {USED})
    assert done.removing == [STALE]
    message = link.outbox.get_nowait()  # type: ignore[attr-defined]
    kind, value = betterproto.which_one_of(message, "kind")
    assert (kind, value.sources) == ("remove_weights", [STALE])


async def test_a_heartbeat_saying_the_weights_are_gone_empties_the_nodes_list() -> None:
    inventory, _ = _inventory()
    inventory.heartbeat("n1", pb.Heartbeat(weights_changed=True, weights=[]))
    assert inventory.node("n1").weights == []  # type: ignore[union-attr]
    assert (await collect_weights(inventory, set()))[0].removing == []


async def test_a_node_not_connected_is_not_asked_and_says_so() -> None:
    inventory, link = _inventory()
    inventory.detach(link)  # type: ignore[arg-type]
    (done,) = await collect_weights(inventory, set())
    assert done.removing == []
    assert done.error == "node n1 is not connected; nothing was removed there"


def test_a_source_with_several_copies_on_a_node_is_planned_once_and_kept_if_any_copy_is_open() -> None:
    """A copy per set of pins: two entries with one source, which RemoveWeights names once."""
    inventory = Inventory(grace_s=10)
    inventory.attach(
        pb.Register(
            node_id="n1",
            weights=[
                pb.Weights(source=STALE, path="/w/a", sha256="aa"),
                pb.Weights(source=STALE, path="/w/a-pin", sha256="bb"),
                pb.Weights(source=OPEN, path="/w/o", sha256="cc"),
                pb.Weights(source=OPEN, path="/w/o-pin", sha256="dd", in_use=True),
            ],
        )
    )
    (plan,) = plan_collection(inventory, set())
    assert plan.removing == [STALE]
    assert plan.kept == [f"{OPEN} (an engine on n1 uses it)"]


def test_a_local_source_is_kept_by_the_url_the_server_serves_it_at() -> None:
    """A node reports the URL it fetched from, never the path on the server's disk."""
    model = ModelConfig(
        name="tiny", source="/srv/models/tiny.gguf", profiles=[ProfileConfig(engine="llamacpp")]
    )
    served = f"http://cp:7444/weights/{key_of(model)}/tiny.gguf"
    inventory = Inventory(grace_s=10)
    inventory.attach(pb.Register(node_id="n1", weights=[pb.Weights(source=served), pb.Weights(source=STALE)]))
    (plan,) = plan_collection(inventory, wanted_sources(inventory, [model]))
    assert plan.removing == [STALE]
    assert plan.kept == [f"{served} (a model in the catalog uses it)"]
