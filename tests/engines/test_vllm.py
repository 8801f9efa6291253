"""The vLLM adapter's command line, as a stand-in `vllm` receives it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import attrs
import pytest

from llmgw.engines.base import LaunchSpec
from llmgw.engines.vllm import VllmEngine
from llmgw.errors import LlmgwError

STAND_IN = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
"""


async def recorded(spec: LaunchSpec, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """Run the adapter's argv and environment with a stand-in binary; what it received."""
    binary = tmp_path / "vllm"
    binary.write_text(STAND_IN)
    binary.chmod(0o755)
    record = tmp_path / "record.json"
    engine = VllmEngine()
    spec = attrs.evolve(spec, binary=str(binary))
    env = {"PATH": "/usr/bin:/bin", "RECORD": str(record), **engine.environment(spec)}
    process = await asyncio.create_subprocess_exec(*engine.command(spec), env=env)
    assert await process.wait() == 0
    got = json.loads(record.read_text())
    return got["argv"], got["env"]


async def test_a_single_node_replica_serves_its_weights_under_the_catalog_name(tmp_path: Path) -> None:
    spec = LaunchSpec(
        model="qwen-7b", port=8100, model_path="/w/qwen", gpu_indices=(0, 1), context_size=8192, parallel=64
    )
    argv, env = await recorded(spec, tmp_path)
    assert argv == [
        "serve", "/w/qwen",
        "--host", "127.0.0.1",
        "--port", "8100",
        "--served-model-name", "qwen-7b",
        "--tensor-parallel-size", "2",
        "--max-model-len", "8192",
        "--max-num-seqs", "64",
    ]  # fmt: skip
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


async def test_rank_zero_of_a_two_node_replica_serves_http_with_every_gpu_in_its_tensor_parallel_size(
    tmp_path: Path,
) -> None:
    spec = LaunchSpec(
        model="big",
        port=8100,
        model_path="/w/big",
        gpu_indices=(0, 1, 2, 3),
        rank=0,
        world_size=2,
        master_addr="10.0.0.5",
        master_port=29500,
    )
    argv, _ = await recorded(spec, tmp_path)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[-8:] == [
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.5", "--master-port", "29500"
    ]  # fmt: skip
    assert "--headless" not in argv


async def test_the_other_ranks_run_headless(tmp_path: Path) -> None:
    spec = LaunchSpec(
        model="big",
        port=8100,
        model_path="/w/big",
        gpu_indices=(0, 1, 2, 3),
        rank=1,
        world_size=2,
        master_addr="10.0.0.5",
        master_port=29500,
        args=("--enforce-eager",),
    )
    argv, _ = await recorded(spec, tmp_path)
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[-2:] == ["--headless", "--enforce-eager"]


def test_a_multi_node_replica_without_its_rank_zero_address_is_refused_in_words() -> None:
    spec = LaunchSpec(model="big", port=1, model_path="/w/big", rank=1, world_size=2)
    with pytest.raises(LlmgwError, match="vLLM cannot start rank 1 of big across 2 nodes: the replica"):
        VllmEngine().command(spec)


def test_a_replica_without_weights_is_refused_in_words() -> None:
    with pytest.raises(LlmgwError, match="vLLM cannot serve m: the replica has no weights on this node yet"):
        VllmEngine().command(LaunchSpec(model="m", port=1))


def test_without_a_named_binary_vllm_on_path_is_run_and_probed() -> None:
    engine = VllmEngine()
    assert engine.command(LaunchSpec(model="m", port=1, model_path="/w"))[:2] == ["vllm", "serve"]
    assert engine.probe_command("") == ["vllm", "--version"]
    assert engine.environment(LaunchSpec(model="m", port=1)) == {}


async def test_the_replicas_secret_reaches_vllm_in_its_environment_not_its_command_line(
    tmp_path: Path,
) -> None:
    spec = LaunchSpec(model="qwen-7b", port=20001, model_path="/w/qwen", secret="replica-secret")
    argv, env = await recorded(spec, tmp_path)
    assert env["VLLM_API_KEY"] == "replica-secret"
    assert "replica-secret" not in argv
