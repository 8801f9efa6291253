"""The control plane's series: states read from the inventory when scraped, events counted as they happen."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from llmgw.catalog import Catalog
from llmgw.control.inventory import Inventory
from llmgw.control.metrics import ControlMetrics
from llmgw.control.reconciler import Reconciler
from llmgw.gateway.usage import UsageRecorder
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import Store, open_store

from .test_inventory import Clock, register, status
from .test_reconciler import model, node, server_config


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


class TestStates:
    def test_nodes_replicas_streams_and_heartbeat_ages_are_read_from_the_inventory_when_scraped(self):
        clock = Clock()
        inventory = Inventory(grace_s=15, clock=clock)
        registry = CollectorRegistry()
        metrics = ControlMetrics(registry, inventory)
        assert metrics.snapshot is not None
        inventory.attach(register("n1", status("s1", "ready", "http://127.0.0.1:9001")))
        link = inventory.attach(
            register("n2", status("s2", "starting"), status("s3", "starting", model="other"))
        )
        inventory.detach(link)
        clock.now += 16
        inventory.heartbeat("n1", pb.Heartbeat())
        inventory.expire()
        metrics.snapshot.take()
        assert _value(registry, "llmgw_nodes", state="ready", admin_state="ready") == 1
        assert _value(registry, "llmgw_nodes", state="unreachable", admin_state="ready") == 1
        assert _value(registry, "llmgw_agent_streams") == 1
        assert _value(registry, "llmgw_node_heartbeat_age_seconds", node="n1") == 0
        assert _value(registry, "llmgw_node_heartbeat_age_seconds", node="n2") == 16
        assert _value(registry, "llmgw_replicas", model="sim-chat", state="ready") == 1
        assert _value(registry, "llmgw_replicas", model="sim-chat", state="starting") == 1
        assert _value(registry, "llmgw_replicas", model="other", state="starting") == 1

    def test_what_is_not_taken_again_is_what_the_last_scrape_saw(self):
        """The page's thread reads the snapshot only; the inventory changes on the loop meanwhile."""
        inventory = Inventory(grace_s=15)
        registry = CollectorRegistry()
        metrics = ControlMetrics(registry, inventory)
        assert metrics.snapshot is not None
        metrics.snapshot.take()
        inventory.attach(register("n1"))
        assert b'llmgw_nodes{admin_state="ready",state="ready"}' not in generate_latest(registry)
        metrics.snapshot.take()
        assert b'llmgw_nodes{admin_state="ready",state="ready"} 1.0' in generate_latest(registry)

    async def test_the_usage_writers_lag_grows_while_usage_waits_and_its_batch_size_is_reported(
        self, tmp_path
    ):
        recorder = UsageRecorder()
        registry = CollectorRegistry()
        metrics = ControlMetrics(registry, Inventory(grace_s=15), recorder)
        assert metrics.snapshot is not None
        metrics.snapshot.take()
        assert _value(registry, "llmgw_usage_writer_lag_seconds") == 0
        recorder.record(1, 1, "m", 200, 3, 4, 0.0, 1.0)
        recorder.record(1, 1, "n", 200, 3, 4, 0.0, 1.0)
        metrics.snapshot.take()
        waiting = _value(registry, "llmgw_usage_writer_lag_seconds")
        assert waiting is not None and waiting > 0
        store: Store
        async with open_store(tmp_path / "llmgw.db") as store:
            await recorder.flush(store)
        metrics.snapshot.take()
        assert _value(registry, "llmgw_usage_writer_lag_seconds") == 0
        assert _value(registry, "llmgw_usage_writer_batch_rows") == 2


class TestEvents:
    async def test_a_model_with_nowhere_to_go_counts_a_placement_failure_by_its_main_reason(self):
        inventory = Inventory(grace_s=15)
        node(inventory, "n1", engines=("llamacpp",))
        node(inventory, "n2", engines=("llamacpp",))
        cfg = server_config(model())
        registry = CollectorRegistry()
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, metrics=ControlMetrics(registry))
        await reconciler.reconcile()
        await reconciler.reconcile()
        assert _value(registry, "llmgw_placement_failures_total", model="sim-chat", reason="engine") == 2

    async def test_with_no_node_the_reason_is_no_node(self):
        inventory = Inventory(grace_s=15)
        cfg = server_config(model())
        registry = CollectorRegistry()
        reconciler = Reconciler(cfg, inventory, Catalog(cfg), in_flight={}, metrics=ControlMetrics(registry))
        await reconciler.reconcile()
        assert _value(registry, "llmgw_placement_failures_total", model="sim-chat", reason="no_node") == 1
