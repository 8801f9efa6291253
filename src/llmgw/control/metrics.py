"""The control plane's Prometheus series: nodes, replicas, placement, the reconciler, agents, usage writing.

What is a state (nodes by state, replicas by model, heartbeat ages) is read
from the inventory when a scraper asks, so that nothing is counted twice or
forgotten on a path that changes it; what is an event (a failed placement, a
refused agent) is counted where it happens.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llmgw.control.inventory import Inventory
from llmgw.gateway.usage import UsageRecorder
from llmgw.metrics import Snapshot

# A reconcile pass takes microseconds on an idle catalog and seconds when it waits on a slow stream.
_PASS_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ControlMetrics:
    """The control plane's series in registry; the inventory and usage recorder are read at scrape time."""

    def __init__(
        self,
        registry: CollectorRegistry,
        inventory: Inventory | None = None,
        usage: UsageRecorder | None = None,
    ) -> None:
        """Without inventory only the counted series exist (a reconciler or an agent service alone)."""
        self.placement_failures = Counter(
            "llmgw_placement_failures",
            "Reconcile passes that found nowhere to place a replica, by model and by the reason most "
            "nodes were rejected for (state, engine, gpu_class, cards, memory, fabric, label, backoff, "
            "given_up; "
            "no_node when none is connected, no_profile when the model has none).",
            ["model", "reason"],
            registry=registry,
        )
        self.reconcile_seconds = Histogram(
            "llmgw_reconcile_duration_seconds",
            "How long one reconcile pass took.",
            buckets=_PASS_BUCKETS_S,
            registry=registry,
        )
        self.agents_refused = Counter(
            "llmgw_agent_connections_refused",
            "Agent connections the control plane refused, by reason (tls, no_common_name, "
            "register_timeout, not_registered, wrong_node, version, shutting_down, standby).",
            ["reason"],
            registry=registry,
        )
        self._inventory = inventory
        self._usage = usage
        self.snapshot = Snapshot(registry, self._read) if inventory is not None else None

    def agent_refused(self, reason: str) -> None:
        self.agents_refused.labels(reason).inc()

    def placement_failed(self, model: str, reason: str) -> None:
        self.placement_failures.labels(model, reason).inc()

    def _read(self) -> Iterable[Metric]:
        inventory = self._inventory
        assert inventory is not None
        now = inventory.now()
        nodes = GaugeMetricFamily(
            "llmgw_nodes",
            "Nodes by their state (ready, unreachable) and an administrator's (ready, cordoned, draining).",
            labels=["state", "admin_state"],
        )
        connected = 0
        ages = GaugeMetricFamily(
            "llmgw_node_heartbeat_age_seconds",
            "Seconds since each node's last message on its stream.",
            labels=["node"],
        )
        by_state: Tally[tuple[str, str]] = Tally()
        for node in inventory.nodes():
            by_state[(node.state, node.admin_state)] += 1
            connected += node.connected
            ages.add_metric([node.id], max(now - node.last_seen, 0.0))
        for (state, admin_state), count in sorted(by_state.items()):
            nodes.add_metric([state, admin_state], count)
        replicas = GaugeMetricFamily(
            "llmgw_replicas",
            "Replicas (one per shard) by model and state (starting, loading, ready, failed, draining...).",
            labels=["model", "state"],
        )
        for (model, state), count in sorted(Tally((r.model, r.state) for r in inventory.replicas()).items()):
            replicas.add_metric([model, state], count)
        streams = GaugeMetricFamily("llmgw_agent_streams", "Nodes whose agent's stream is open now.")
        streams.add_metric([], connected)
        yield from (nodes, ages, replicas, streams)
        usage = self._usage
        if usage is not None:
            lag = GaugeMetricFamily(
                "llmgw_usage_writer_lag_seconds",
                "Seconds since usage was last written to the store, while some waits; 0 when none waits.",
            )
            lag.add_metric([], usage.lag(time.monotonic()))
            batch = GaugeMetricFamily(
                "llmgw_usage_writer_batch_rows",
                "Rows (day, key, project, model, status) the usage writer's last batch wrote.",
            )
            batch.add_metric([], usage.last_batch)
            yield from (lag, batch)


def reject_reason(kinds: Iterable[str], fallback: str) -> str:
    """The most common kind of rejection, or fallback when there is none."""
    common = Tally(k for k in kinds if k).most_common(1)
    return common[0][0] if common else fallback
