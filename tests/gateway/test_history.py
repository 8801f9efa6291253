"""The sampled history the pages chart: rates, latency quantiles and GPU memory, in bounded rings."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from llmgw.catalog import Catalog
from llmgw.config import ModelConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.gateway.history import ALL, History, quantile
from llmgw.gateway.metrics import GatewayMetrics
from llmgw.proto.llmgw import v1 as pb
from llmgw.store import Store
from llmgw.web.admin_listener import make_admin_app
from llmgw.web.context import WebContext
from llmgw.web.history import HISTORY_KEY

from ..waiting import eventually

CFG = ServerConfig(admin_listen="127.0.0.1:0", models=[ModelConfig(name="a"), ModelConfig(name="b")])


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _served(metrics: GatewayMetrics, model: str, n: int, seconds: float, status: int = 200) -> None:
    for _ in range(n):
        metrics.count(model, model, "1", status, "", seconds, usage=(10, 5))


@pytest.fixture
def rig() -> tuple[GatewayMetrics, Inventory, Clock]:
    return GatewayMetrics(CollectorRegistry(), Catalog(CFG)), Inventory(grace_s=15), Clock()


class TestSamples:
    def test_each_sample_is_the_change_since_the_last_per_model_and_for_all(self, rig):
        metrics, inventory, clock = rig
        history = History(metrics, inventory, window_s=3600, clock=clock)
        _served(metrics, "a", 5, 0.2)
        history.sample()
        # The first sample only sets the baseline: what came before the server started is no rate.
        assert history.model("a") == []
        clock.now += 10
        _served(metrics, "a", 20, 0.2)
        _served(metrics, "b", 10, 3.0, status=503)
        history.sample()
        (a,) = history.model("a")
        assert a.requests_per_s == 2.0
        assert a.tokens_per_s == 30.0
        assert a.errors_per_s == 0.0
        # 0.2 s lies in the (0.1, 0.25] bucket: interpolated within it, as histogram_quantile does.
        assert a.p50_s == pytest.approx(0.175)
        (b,) = history.model("b")
        assert b.errors_per_s == 1.0
        (everything,) = history.model(ALL)
        assert everything.requests_per_s == 3.0
        assert everything.p95_s is not None and 2.5 < everything.p95_s <= 5.0

    def test_an_interval_without_requests_has_no_latency_rather_than_zero(self, rig):
        metrics, inventory, clock = rig
        history = History(metrics, inventory, window_s=3600, clock=clock)
        _served(metrics, "a", 1, 0.2)
        history.sample()
        clock.now += 10
        history.sample()
        (a,) = history.model("a")
        assert (a.requests_per_s, a.p50_s, a.p95_s) == (0.0, None, None)

    def test_the_rings_keep_only_the_window(self, rig):
        metrics, inventory, clock = rig
        history = History(metrics, inventory, window_s=30, clock=clock)
        for i in range(10):
            _served(metrics, "a", i + 1, 0.2)
            history.sample()
            clock.now += 10
        points = history.model("a")
        assert len(points) == 3
        assert [p.requests_per_s for p in points] == [0.8, 0.9, 1.0]

    def test_gpu_memory_is_sampled_per_node_that_has_gpus(self, rig):
        metrics, inventory, clock = rig
        gpus = [
            pb.Gpu(index=0, memory_total_mb=24000, memory_used_mb=1000, healthy=True),
            pb.Gpu(index=1, memory_total_mb=24000, memory_used_mb=3000, healthy=True),
        ]
        inventory.attach(pb.Register(node_id="gpu-1", gpus=gpus))
        inventory.attach(pb.Register(node_id="cpu-1"))
        history = History(metrics, inventory, window_s=3600, clock=clock)
        history.sample()
        memory = history.gpu_memory()
        assert list(memory) == ["gpu-1"]
        (point,) = memory["gpu-1"]
        assert (point.used_mb, point.total_mb) == (4000, 48000)

    def test_gpu_memory_is_a_point_per_sample_but_kept_only_where_it_changed(self, rig):
        metrics, inventory, clock = rig
        history = History(metrics, inventory, window_s=40, clock=clock)
        used = [1000, 1000, 1000, 5000, 5000, 2000, 2000]
        for mb in used:
            gpus = [pb.Gpu(index=0, memory_total_mb=24000, memory_used_mb=mb, healthy=True)]
            inventory.attach(pb.Register(node_id="gpu-1", gpus=gpus))
            history.sample()
            clock.now += 10
        # The window holds 4 samples; the node's figures the last 4 samples saw, step by step.
        points = history.gpu_memory()["gpu-1"]
        assert [(p.at, p.used_mb) for p in points] == [
            (clock.now - 40, 5000),
            (clock.now - 30, 5000),
            (clock.now - 20, 2000),
            (clock.now - 10, 2000),
        ]
        # Three values over seven samples: three kept.
        assert len(history._gpus["gpu-1"].changes) == 3


class _Gpu:
    memory_used_mb = 10
    memory_total_mb = 80


class _Watched:
    """A node that notes, when its GPUs are first read, how often the loop has turned by then."""

    def __init__(self, node_id: str, turns: list[int], seen: dict[str, int]) -> None:
        self.id = node_id
        self._turns = turns
        self._seen = seen

    @property
    def gpus(self) -> list[_Gpu]:
        self._seen.setdefault(self.id, self._turns[0])
        return [_Gpu()]


class _Fleet:
    def __init__(self, nodes: list[_Watched]) -> None:
        self._nodes = nodes

    def nodes(self) -> list[_Watched]:
        return self._nodes


async def test_a_sample_of_thousands_of_nodes_gives_the_loop_back_between_steps(rig):
    metrics, _, clock = rig
    turns: list[int] = [0]
    seen: dict[str, int] = {}
    history = History(
        metrics,
        _Fleet([_Watched(f"n{i}", turns, seen) for i in range(5000)]),
        window_s=3600,
        interval_s=0.01,
        clock=clock,
    )

    async def turn() -> None:
        while True:
            await asyncio.sleep(0)
            turns[0] += 1

    other, sampler = asyncio.create_task(turn()), asyncio.create_task(history.run())
    try:
        await eventually(lambda: len(seen) == 5000, within_s=30)
    finally:
        other.cancel()
        sampler.cancel()
        await asyncio.gather(other, sampler, return_exceptions=True)
    # One sample read the 5,000 nodes over several turns of the loop, not in one go.
    assert len(set(seen.values())) >= 10


class TestQuantile:
    def test_no_observation_is_no_quantile(self):
        assert quantile(0.5, [0.1, float("inf")], [0.0, 0.0]) is None

    def test_a_quantile_in_the_infinite_bucket_is_the_highest_finite_bound(self):
        assert quantile(0.99, [0.1, 600.0, float("inf")], [0.0, 0.0, 4.0]) == 600.0


async def test_the_cluster_and_models_pages_chart_the_history(rig, store: Store):
    metrics, inventory, clock = rig
    inventory.attach(pb.Register(node_id="gpu-1", gpus=[pb.Gpu(memory_total_mb=24000, memory_used_mb=1)]))
    history = History(metrics, inventory, window_s=3600, clock=clock)
    for _ in range(3):
        _served(metrics, "a", 4, 0.05)
        history.sample()
        clock.now += 10
    app = make_admin_app(CFG, inventory, Catalog(CFG), WebContext(cfg=CFG, store=store))
    app[HISTORY_KEY] = history
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
        async with session.get(server.make_url("/")) as reply:
            cluster = await reply.text()
        async with session.get(server.make_url("/models")) as reply:
            models = await reply.text()
    assert cluster.count('<svg class="chart small"') == 5
    assert "requests/s: now 0.4" in cluster
    assert "GPU memory, gpu-1" in cluster
    section = models[models.index('id="model-a"') : models.index('id="model-b"')]
    assert section.count('<svg class="chart small"') == 4
    assert "latency: p50" in section
    # Model b served nothing yet: no chart rather than an empty one.
    assert '<svg class="chart small"' not in models[models.index('id="model-b"') :]
