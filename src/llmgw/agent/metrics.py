"""The agent's Prometheus series, and its engines' own, so that one scrape per node covers them all.

Served on agent.yaml's `metrics_listen` (off by default). Before each page the
agent reads every ready engine's own metrics page (concurrently, each within
a few seconds) and re-exports its series under their own names (llama.cpp's
`llamacpp:*`, vLLM's `vllm:*`) with `model`, `replica` and `node` labels added;
an engine label of the same name is kept as `exported_<name>`, as Prometheus
itself does. An engine that does not answer in time is left out of that page
and counted in `llmgw_agent_engine_scrape_errors_total`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence

import aiohttp
import attrs
import structlog
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from llmgw.agent.discovery.gpus import GpuReading
from llmgw.metrics import Snapshot
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

# An engine busy prefilling a long prompt still answers its metrics in well under this; one that
# does not must not hold the whole node's page past a scraper's usual 10 s timeout.
ENGINE_SCRAPE_TIMEOUT_S = 3.0
_ADDED = ("model", "replica", "node")


@attrs.frozen
class MetricsTarget:
    """A ready engine's metrics page: what the agent's /metrics re-exports, labelled with its replica."""

    shard_id: str
    model: str
    replica: str
    url: str
    secret: str = attrs.field(repr=False)


class AgentMetrics:
    """The agent's series: engines, restarts, installs, downloads, GPUs, and the engines' own pages."""

    def __init__(
        self,
        registry: CollectorRegistry,
        node_id: str,
        *,
        engines: Callable[[], Sequence[pb.ShardStatus]],
        restarts: Callable[[], dict[str, int]],
        installs: Callable[[], Sequence[pb.ProvisionStatus]],
        downloaded: Callable[[], int],
        gpus: Callable[[], Sequence[pb.Gpu]],
        gpu_readings: Callable[[], Mapping[int, GpuReading]] = dict,
        targets: Callable[[], Sequence[MetricsTarget]],
    ) -> None:
        """Each callable reads the agent's state on the event loop, when a scraper asks."""
        self.registry = registry
        self._node = node_id
        self._engines = engines
        self._restarts = restarts
        self._installs = installs
        self._downloaded = downloaded
        self._gpus = gpus
        self._gpu_readings = gpu_readings
        self._targets = targets
        self.scrape_errors = Counter(
            "llmgw_agent_engine_scrape_errors",
            "Times an engine's own metrics page did not answer in time and was left out, by model.",
            ["model"],
            registry=registry,
        )
        self.state = Snapshot(registry, self._read)
        self._engine_families: list[Metric] = []
        self.engine_pages = Snapshot(registry, lambda: self._engine_families)

    async def refresh(self) -> None:
        """Read every ready engine's metrics page, then parse them off the loop."""
        targets = list(self._targets())
        if not targets:
            self._engine_families = []
            return
        timeout = aiohttp.ClientTimeout(total=ENGINE_SCRAPE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            pages = await asyncio.gather(*(self._fetch(session, t) for t in targets))
        read = [(t, page) for t, page in zip(targets, pages, strict=True) if page is not None]
        self._engine_families = await asyncio.to_thread(relabel, read, self._node)

    async def _fetch(self, session: aiohttp.ClientSession, target: MetricsTarget) -> str | None:
        headers = {"Authorization": f"Bearer {target.secret}"} if target.secret else {}
        try:
            async with session.get(target.url, headers=headers) as reply:
                if reply.status == 200:
                    return await reply.text()
                reason = f"HTTP {reply.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
        self.scrape_errors.labels(target.model).inc()
        log.warning(
            "an engine's metrics page did not answer", shard=target.shard_id, url=target.url, error=reason
        )
        return None

    def _read(self) -> Iterable[Metric]:
        engines = GaugeMetricFamily(
            "llmgw_agent_engines",
            "Engine processes on this node by model, engine and state (downloading, starting, ready...).",
            labels=["model", "engine", "state"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        for status in self._engines():
            key = (status.model, status.engine, status.state)
            counts[key] = counts.get(key, 0) + 1
        for labels, count in sorted(counts.items()):
            engines.add_metric(list(labels), count)
        restarts = CounterMetricFamily(
            "llmgw_agent_engine_restarts",
            "Engines that crashed after serving, by model, since the agent started; "
            "the control plane starts them again.",
            labels=["model"],
        )
        for model, count in sorted(self._restarts().items()):
            restarts.add_metric([model], count)
        installs = GaugeMetricFamily(
            "llmgw_agent_engine_install",
            "1 for each engine's installation state on this node (installing, ready, failed, unsupported).",
            labels=["engine", "version", "state"],
        )
        for install in self._installs():
            installs.add_metric([install.engine, install.version, install.state], 1)
        downloaded = CounterMetricFamily(
            "llmgw_agent_downloaded_bytes",
            "Bytes of model weights this agent has downloaded since it started.",
        )
        downloaded.add_metric([], self._downloaded())
        yield from (engines, restarts, installs, downloaded)
        yield from _gpu_families(self._gpus(), self._gpu_readings())


def _gpu_families(gpus: Sequence[pb.Gpu], readings: Mapping[int, GpuReading]) -> Iterable[Metric]:
    if not gpus:
        return
    used = GaugeMetricFamily(
        "llmgw_gpu_memory_used_bytes", "GPU memory in use, as NVML reports it.", labels=["gpu", "gpu_class"]
    )
    total = GaugeMetricFamily(
        "llmgw_gpu_memory_total_bytes", "GPU memory the driver can use.", labels=["gpu", "gpu_class"]
    )
    healthy = GaugeMetricFamily(
        "llmgw_gpu_healthy",
        "1 for a GPU placement may use; 0 after an XID, ECC fault, or when it stopped answering NVML.",
        labels=["gpu", "gpu_class"],
    )
    utilization = GaugeMetricFamily(
        "llmgw_gpu_utilization_ratio",
        "Share of the last sample period a kernel ran on the GPU (NVML's utilisation), 0 to 1.",
        labels=["gpu", "gpu_class"],
    )
    temperature = GaugeMetricFamily(
        "llmgw_gpu_temperature_celsius", "The GPU's core temperature.", labels=["gpu", "gpu_class"]
    )
    for gpu in gpus:
        labels = [str(gpu.index), gpu.gpu_class]
        used.add_metric(labels, gpu.memory_used_mb * 2**20)
        total.add_metric(labels, gpu.memory_total_mb * 2**20)
        healthy.add_metric(labels, 1 if gpu.healthy else 0)
        reading = readings.get(gpu.index)
        if reading is not None and reading.utilization_percent is not None:
            utilization.add_metric(labels, reading.utilization_percent / 100)
        if reading is not None and reading.temperature_celsius is not None:
            temperature.add_metric(labels, reading.temperature_celsius)
    yield from (used, total, healthy, utilization, temperature)


def relabel(pages: Sequence[tuple[MetricsTarget, str]], node: str) -> list[Metric]:
    """The engines' pages as families under their own names, each sample with model, replica and node.

    Families of the same name from several engines (two llama.cpp replicas) are merged into one, so
    that the page names each family once. A page that is not Prometheus text is left out, logged.
    """
    families: dict[str, Metric] = {}
    for target, text in pages:
        added = {"model": target.model, "replica": target.replica, "node": node}
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError as exc:
            log.warning(
                "an engine's metrics page is not Prometheus text", shard=target.shard_id, error=str(exc)
            )
            continue
        for family in parsed:
            into = families.get(family.name)
            if into is None:
                into = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            elif into.type != family.type:
                # Two engines disagreeing on a name's type: the first one's stands, the page stays valid.
                continue
            for sample in family.samples:
                labels = {
                    (f"exported_{name}" if name in _ADDED else name): value
                    for name, value in sample.labels.items()
                }
                labels.update(added)
                into.samples.append(
                    Sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
                )
    return list(families.values())
