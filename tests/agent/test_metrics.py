"""The agent's /metrics: its own series, and its engines' pages re-exported with their replica's labels."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Sequence

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, generate_latest

from llmgw.agent.discovery.gpus import GpuReading
from llmgw.agent.metrics import AgentMetrics, MetricsTarget, relabel
from llmgw.metrics import Metrics
from llmgw.proto.llmgw import v1 as pb
from tests import needs

LLAMACPP_PAGE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
"""
# vLLM labels its series with the model's name itself; that label must not be overwritten.
VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model="Qwen/Qwen3-8B"} 3
"""


def _target(
    shard: str, model: str, url: str = "http://127.0.0.1:1/metrics", secret: str = ""
) -> MetricsTarget:
    return MetricsTarget(shard_id=shard, model=model, replica=f"{model}-r{shard}", url=url, secret=secret)


def _metrics(
    registry: CollectorRegistry,
    *,
    targets: Sequence[MetricsTarget] = (),
    engines: Sequence[pb.ShardStatus] = (),
    gpus: Sequence[pb.Gpu] = (),
    readings: dict[int, GpuReading] | None = None,
) -> tuple[AgentMetrics, Metrics]:
    agent = AgentMetrics(
        registry,
        "node-1",
        engines=lambda: list(engines),
        restarts=lambda: {"sim-chat": 2},
        installs=lambda: [pb.ProvisionStatus(engine="llamacpp", version="b11434", state="installing")],
        downloaded=lambda: 4096,
        gpus=lambda: list(gpus),
        gpu_readings=lambda: readings or {},
        targets=lambda: list(targets),
    )
    return agent, Metrics(registry, [agent.state, agent.engine_pages], [agent.refresh])


class TestRelabel:
    def test_each_engines_series_keep_their_names_and_gain_model_replica_and_node(self):
        families = relabel(
            [(_target("1", "a"), LLAMACPP_PAGE), (_target("2", "b"), LLAMACPP_PAGE)],
            "node-1",
        )
        registry = CollectorRegistry()
        registry.register(_Fixed(families))
        text = generate_latest(registry).decode()
        # One family, both replicas' samples under it.
        assert text.count("# TYPE llamacpp:prompt_tokens_total counter") == 1
        assert 'llamacpp:prompt_tokens_total{model="a",node="node-1",replica="a-r1"} 120.0' in text
        assert 'llamacpp:prompt_tokens_total{model="b",node="node-1",replica="b-r2"} 120.0' in text
        assert 'llamacpp:requests_processing{model="a",node="node-1",replica="a-r1"} 2.0' in text

    def test_an_engines_own_label_of_the_same_name_is_kept_as_exported(self):
        families = relabel([(_target("1", "qwen"), VLLM_PAGE)], "node-1")
        (family,) = families
        (sample,) = family.samples
        assert sample.labels == {
            "exported_model": "Qwen/Qwen3-8B",
            "model": "qwen",
            "replica": "qwen-r1",
            "node": "node-1",
        }

    def test_a_page_that_is_not_prometheus_text_is_left_out(self):
        families = relabel(
            [(_target("1", "a"), "<html>not metrics</html>{"), (_target("2", "b"), LLAMACPP_PAGE)], "n"
        )
        assert {s.labels["model"] for f in families for s in f.samples} == {"b"}


class _Fixed:
    def __init__(self, families: list[object]) -> None:
        self._families = families

    def collect(self) -> list[object]:
        return self._families


@pytest.fixture
async def engine_page() -> AsyncIterator[tuple[str, list[str]]]:
    """A llama.cpp-like metrics page wanting a secret; yields its URL and the Authorization headers seen."""
    seen: list[str] = []

    async def metrics(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.Response(status=401)
        return web.Response(text=LLAMACPP_PAGE)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}/metrics", seen
    await server.close()


class TestPage:
    async def test_the_page_has_the_agents_series_and_each_ready_engines_own(
        self, engine_page: tuple[str, list[str]]
    ):
        url, seen = engine_page
        registry = CollectorRegistry()
        gpu = pb.Gpu(index=0, gpu_class="h100-80g", memory_total_mb=81559, memory_used_mb=1024, healthy=True)
        _, metrics = _metrics(
            registry,
            targets=[_target("1", "sim-chat", url, secret="s3cret")],
            engines=[
                pb.ShardStatus(model="sim-chat", engine="llamacpp", state="ready"),
                pb.ShardStatus(model="other", engine="llamacpp", state="starting"),
            ],
            gpus=[gpu],
            readings={0: GpuReading(utilization_percent=87.0, temperature_celsius=71.0)},
        )
        text = (await metrics.page()).decode()
        assert seen == ["Bearer s3cret"]
        assert (
            'llamacpp:prompt_tokens_total{model="sim-chat",node="node-1",replica="sim-chat-r1"} 120.0' in text
        )
        assert 'llmgw_agent_engines{engine="llamacpp",model="sim-chat",state="ready"} 1.0' in text
        assert 'llmgw_agent_engines{engine="llamacpp",model="other",state="starting"} 1.0' in text
        assert 'llmgw_agent_engine_restarts_total{model="sim-chat"} 2.0' in text
        assert 'llmgw_agent_engine_install{engine="llamacpp",state="installing",version="b11434"} 1.0' in text
        assert "llmgw_agent_downloaded_bytes_total 4096.0" in text
        assert 'llmgw_gpu_memory_used_bytes{gpu="0",gpu_class="h100-80g"} 1.073741824e+09' in text
        assert 'llmgw_gpu_healthy{gpu="0",gpu_class="h100-80g"} 1.0' in text
        assert 'llmgw_gpu_utilization_ratio{gpu="0",gpu_class="h100-80g"} 0.87' in text
        assert 'llmgw_gpu_temperature_celsius{gpu="0",gpu_class="h100-80g"} 71.0' in text
        promtool = needs.program("promtool", "prometheus")
        checked = await asyncio.to_thread(
            subprocess.run, [promtool, "check", "metrics"], input=text, capture_output=True, text=True
        )
        # promtool's one objection is to llama.cpp's own names, which keep their colons so that
        # llama.cpp's dashboards work unchanged; everything llmgw names itself passes.
        complaints = [line for line in checked.stderr.splitlines() if line.strip()]
        assert complaints == [
            "llamacpp:prompt_tokens_total metric names should not contain ':'",
            "llamacpp:requests_processing metric names should not contain ':'",
        ]
        own = "".join(line + "\n" for line in text.splitlines() if "llamacpp:" not in line)
        checked = await asyncio.to_thread(
            subprocess.run, [promtool, "check", "metrics"], input=own, capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr

    async def test_an_engine_that_does_not_answer_is_left_out_and_counted(self, engine_page):
        url, _ = engine_page
        registry = CollectorRegistry()
        # The wrong secret: the engine answers 401.
        _, metrics = _metrics(registry, targets=[_target("1", "sim-chat", url, secret="wrong")])
        text = (await metrics.page()).decode()
        assert "llamacpp:" not in text
        assert 'llmgw_agent_engine_scrape_errors_total{model="sim-chat"} 1.0' in text

    async def test_without_gpus_no_gpu_series_are_written(self):
        _, metrics = _metrics(CollectorRegistry())
        assert b"llmgw_gpu_" not in await metrics.page()
