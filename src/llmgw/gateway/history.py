"""The last hours of the gateway and the nodes, sampled every 10 s, for the pages' charts without Prometheus.

Each sample is what changed in the gateway's own counters since the one
before (requests, tokens and 5xx replies per second, p50 and p95 latency from
the histogram's buckets, as Prometheus's histogram_quantile reads them) and
each node's GPU memory as its agent last reported it. The rings are bounded
(`monitoring.window_s` over the interval), so memory stays flat however long
the server runs; a restart starts them empty. A node's GPU memory is kept
only when it changed: one point per node per sample was 2,160 points a node
over the default six hours, gigabytes at 10,000 nodes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

import attrs
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from llmgw.gateway.metrics import GatewayMetrics

_T = TypeVar("_T")

SAMPLE_INTERVAL_S = 10.0
# Nodes sampled between two returns to the event loop: about 2 ms of it.
NODES_PER_STEP = 500
# The chart of the whole gateway, every model together.
ALL = ""


class _Gpu(Protocol):
    @property
    def memory_used_mb(self) -> int: ...

    @property
    def memory_total_mb(self) -> int: ...


class _Node(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def gpus(self) -> Sequence[_Gpu]: ...


class Nodes(Protocol):
    """What the history needs of the inventory: its nodes, with the GPUs each last reported."""

    def nodes(self) -> Sequence[_Node]: ...


@attrs.frozen
class Point:
    """One interval of one model (or of all): rates per second, and latency quantiles in seconds."""

    at: float
    requests_per_s: float
    tokens_per_s: float
    errors_per_s: float
    # None when no request finished in the interval: no latency to speak of, not a latency of 0.
    p50_s: float | None
    p95_s: float | None


@attrs.frozen
class GpuPoint:
    at: float
    used_mb: int
    total_mb: int


@attrs.define
class _Totals:
    requests: float = 0.0
    tokens: float = 0.0
    errors: float = 0.0
    # Cumulative count at each bucket's upper bound, as Prometheus keeps them.
    buckets: dict[float, float] = attrs.field(factory=dict)


class History:
    """Bounded rings of samples per model and per node; `run` samples every interval until cancelled."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        inventory: Nodes,
        window_s: float,
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._metrics = metrics
        self._inventory = inventory
        self.interval_s = interval_s
        self._size = max(int(window_s // interval_s), 1)
        self._clock = clock
        self._models: dict[str, deque[Point]] = {}
        # The times of the last samples, and per node its GPU memory where it changed and the last
        # sample that saw the node: gpu_memory() gives back one point per sample.
        self._times: deque[float] = deque(maxlen=self._size)
        self._gpus: dict[str, _GpuChanges] = {}
        self._last: dict[str, _Totals] | None = None
        self._last_at = 0.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            # In steps, back to the loop between them: the gateway serves on it, and one pass over
            # 10,000 nodes held it 40 ms.
            for _ in self._steps():
                await asyncio.sleep(0)

    def sample(self) -> None:
        """Take one sample now: the change since the last one, per model and for all; GPU memory per node."""
        for _ in self._steps():
            pass

    def _steps(self) -> Iterator[None]:
        """One sample, pausing after every NODES_PER_STEP nodes."""
        now = self._clock()
        totals = _read(self._metrics)
        if self._last is not None and now > self._last_at:
            elapsed = now - self._last_at
            for model, current in totals.items():
                before = self._last.get(model, _Totals())
                self._ring(self._models, model).append(_point(now, elapsed, before, current))
        self._last, self._last_at = totals, now
        self._times.append(now)
        for i, node in enumerate(self._inventory.nodes()):
            if i and not i % NODES_PER_STEP:
                yield
            if node.gpus:
                used = sum(g.memory_used_mb for g in node.gpus)
                total = sum(g.memory_total_mb for g in node.gpus)
                changes = self._gpus.get(node.id)
                if changes is None:
                    changes = self._gpus[node.id] = _GpuChanges(deque(maxlen=self._size))
                changes.seen(now, used, total)

    def _ring(self, rings: dict[str, deque[_T]], name: str) -> deque[_T]:
        ring = rings.get(name)
        if ring is None:
            ring = rings[name] = deque(maxlen=self._size)
        return ring

    def model(self, name: str) -> Sequence[Point]:
        """The samples of one model, oldest first; ALL for every model together."""
        return list(self._models.get(name, ()))

    def gpu_memory(self, nodes: Iterable[str] | None = None) -> Mapping[str, Sequence[GpuPoint]]:
        """GPU memory samples, oldest first, of each node (of nodes, when given) that has GPUs."""
        wanted = sorted(self._gpus) if nodes is None else sorted(set(nodes) & self._gpus.keys())
        return {node: self._gpus[node].points(self._times) for node in wanted}


@attrs.define
class _GpuChanges:
    """One node's GPU memory where it changed, (at, used_mb, total_mb), and when it was last sampled."""

    changes: deque[tuple[float, int, int]]
    last_at: float = 0.0

    def seen(self, now: float, used: int, total: int) -> None:
        if not self.changes or self.changes[-1][1:] != (used, total):
            self.changes.append((now, used, total))
        self.last_at = now

    def points(self, times: Iterable[float]) -> list[GpuPoint]:
        """A point at every sample time from the node's first to its last, with the value it then had."""
        points = []
        changes = list(self.changes)
        at = 0
        for t in times:
            if t > self.last_at:
                break
            while at + 1 < len(changes) and changes[at + 1][0] <= t:
                at += 1
            if changes and changes[at][0] <= t:
                points.append(GpuPoint(t, changes[at][1], changes[at][2]))
        return points


def _read(metrics: GatewayMetrics) -> dict[str, _Totals]:
    """The gateway's cumulative counts per model label, and summed over all of them under ALL."""
    totals: dict[str, _Totals] = {ALL: _Totals()}

    def of(model: str) -> Iterable[_Totals]:
        if model not in totals:
            totals[model] = _Totals()
        # A request for a name the catalog does not serve ("") counts only towards all.
        return (totals[ALL], totals[model]) if model else (totals[ALL],)

    families = list(metrics.collect())
    for sample in _samples(families, "llmgw_requests_total"):
        for t in of(sample.labels["model"]):
            t.requests += sample.value
            if sample.labels["status"] == "5xx":
                t.errors += sample.value
    for name in ("llmgw_prompt_tokens_total", "llmgw_completion_tokens_total"):
        for sample in _samples(families, name):
            for t in of(sample.labels["model"]):
                t.tokens += sample.value
    for sample in _samples(families, "llmgw_request_duration_seconds_bucket"):
        bound = float(sample.labels["le"])
        for t in of(sample.labels["model"]):
            t.buckets[bound] = t.buckets.get(bound, 0.0) + sample.value
    return totals


def _samples(families: Iterable[Metric], name: str) -> Iterable[Sample]:
    return (s for f in families for s in f.samples if s.name == name)


def _point(now: float, elapsed: float, before: _Totals, current: _Totals) -> Point:
    bounds = sorted(current.buckets)
    counts = [current.buckets[b] - before.buckets.get(b, 0.0) for b in bounds]
    return Point(
        at=now,
        requests_per_s=max(current.requests - before.requests, 0.0) / elapsed,
        tokens_per_s=max(current.tokens - before.tokens, 0.0) / elapsed,
        errors_per_s=max(current.errors - before.errors, 0.0) / elapsed,
        p50_s=quantile(0.5, bounds, counts),
        p95_s=quantile(0.95, bounds, counts),
    )


def quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The q-quantile from cumulative bucket counts, interpolated within its bucket (histogram_quantile).

    None without observations. A quantile in the +Inf bucket is the highest finite bound.
    """
    if not bounds or cumulative[-1] <= 0:
        return None
    rank = q * cumulative[-1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound
