"""The supervisor runs the engine binary the provision loop installed, or the one agent.yaml names."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs

from llmgw.agent.supervisor import Supervisor
from llmgw.config import AgentConfig, EngineOptions
from llmgw.engines.base import Engine, LaunchSpec
from llmgw.proto.llmgw import v1 as pb
from llmgw.roles.agent import _binary_for


@attrs.define
class RecordingEngine(Engine):
    """Records the spec it is asked to launch and names a program that is not there."""

    specs: list[LaunchSpec] = attrs.field(factory=list)
    name: str = "llamacpp"
    health_path: str = "/health"
    metrics_path: str = "/metrics"

    def command(self, spec: LaunchSpec) -> list[str]:
        self.specs.append(spec)
        return [spec.binary or "/nonexistent/llama-server", "--port", str(spec.port)]

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        return {}

    def probe_command(self, binary: str) -> list[str]:
        return [binary, "--version"]


async def test_the_supervisor_launches_the_binary_it_is_given_for_the_engine(tmp_path: Path) -> None:
    engine = RecordingEngine()
    failed = asyncio.Event()
    binary = str(tmp_path / "engines" / "llamacpp-b1-cpu" / "llama-server")

    def heard(status: pb.ShardStatus) -> None:
        if status.state == "failed":
            failed.set()

    async with Supervisor(
        {"llamacpp": engine}, on_status=heard, binaries=lambda engine: binary, state_dir=tmp_path
    ) as supervisor:
        await supervisor.start(pb.StartShard(shard_id="s1", model="m", engine="llamacpp"))
        async with asyncio.timeout(10):
            await failed.wait()
    assert [spec.binary for spec in engine.specs] == [binary]


def test_the_installed_binary_is_used_and_agent_yaml_names_the_rest() -> None:
    cfg = AgentConfig(engines={"vllm": EngineOptions(binary="/opt/vllm/bin/vllm")})
    installed = {"llamacpp": "/var/lib/llmgw-agent/engines/llamacpp/llama-server"}
    assert _binary_for(cfg, installed, "llamacpp") == installed["llamacpp"]
    assert _binary_for(cfg, installed, "vllm") == "/opt/vllm/bin/vllm"
    assert _binary_for(cfg, installed, "sim") == ""
