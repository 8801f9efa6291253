"""What the reconciler tells a node to start carries where the weights come from and their pins."""

from __future__ import annotations

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.proto.llmgw import v1 as pb

PIN = "ab" * 32


async def test_a_start_shard_carries_the_models_source_and_sha256_pins() -> None:
    model = ModelConfig(
        name="tiny",
        source="https://models.example/tiny/q4_k_m.gguf",
        sha256={"q4_k_m.gguf": PIN},
        profiles=[ProfileConfig(engine="sim")],
    )
    inventory = Inventory(grace_s=10)
    link = inventory.attach(
        pb.Register(node_id="n1", engine_versions={"sim": "builtin"}, engines_probed=True)
    )
    cfg = ServerConfig(models=[model])
    await Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).reconcile()
    start = link.outbox.get_nowait().start
    assert (start.model, start.source, start.sha256) == (
        "tiny",
        "https://models.example/tiny/q4_k_m.gguf",
        {"q4_k_m.gguf": PIN},
    )
