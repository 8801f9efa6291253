"""The SGLang adapter's command line, as a stand-in interpreter receives it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import attrs
import pytest

from llmgw.engines.base import LaunchSpec
from llmgw.engines.sglang import SglangEngine
from llmgw.errors import LlmgwError

STAND_IN = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
"""


async def recorded(spec: LaunchSpec, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """Run the adapter's argv and environment with a stand-in interpreter; what it received."""
    binary = tmp_path / "python3"
    binary.write_text(STAND_IN)
    binary.chmod(0o755)
    record = tmp_path / "record.json"
    engine = SglangEngine()
    spec = attrs.evolve(spec, binary=str(binary))
    env = {"PATH": "/usr/bin:/bin", "RECORD": str(record), **engine.environment(spec)}
    process = await asyncio.create_subprocess_exec(*engine.command(spec), env=env)
    assert await process.wait() == 0
    got = json.loads(record.read_text())
    return got["argv"], got["env"]


async def test_a_single_node_replica_serves_its_weights_under_the_catalog_name_with_metrics(
    tmp_path: Path,
) -> None:
    spec = LaunchSpec(model="qwen-7b", port=8200, model_path="/w/qwen", gpu_indices=(3,), context_size=4096)
    argv, env = await recorded(spec, tmp_path)
    assert argv == [
        "-m", "sglang.launch_server",
        "--model-path", "/w/qwen",
        "--host", "127.0.0.1",
        "--port", "8200",
        "--served-model-name", "qwen-7b",
        "--tp", "1",
        "--enable-metrics",
        "--context-length", "4096",
    ]  # fmt: skip
    assert env["CUDA_VISIBLE_DEVICES"] == "3"


async def test_each_rank_of_a_two_node_replica_names_the_total_tp_and_rank_zeros_address(
    tmp_path: Path,
) -> None:
    spec = LaunchSpec(
        model="big",
        port=8200,
        model_path="/w/big",
        gpu_indices=tuple(range(8)),
        parallel=32,
        rank=1,
        world_size=2,
        master_addr="10.0.0.5",
        master_port=20000,
        args=("--trust-remote-code",),
    )
    argv, _ = await recorded(spec, tmp_path)
    assert argv[argv.index("--tp") + 1] == "16"
    assert argv[argv.index("--max-running-requests") + 1] == "32"
    assert argv[-7:] == [
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.5:20000", "--trust-remote-code"
    ]  # fmt: skip


def test_an_ipv6_rank_zero_address_is_bracketed() -> None:
    spec = LaunchSpec(
        model="m", port=1, model_path="/w", world_size=2, master_addr="fd00::5", master_port=20000
    )
    argv = SglangEngine().command(spec)
    assert argv[argv.index("--dist-init-addr") + 1] == "[fd00::5]:20000"


def test_a_multi_node_replica_without_its_rank_zero_address_is_refused_in_words() -> None:
    spec = LaunchSpec(model="big", port=1, model_path="/w/big", rank=1, world_size=2)
    with pytest.raises(LlmgwError, match="SGLang cannot start rank 1 of big across 2 nodes"):
        SglangEngine().command(spec)


def test_without_a_named_interpreter_python3_runs_and_probes_it() -> None:
    engine = SglangEngine()
    assert engine.command(LaunchSpec(model="m", port=1, model_path="/w"))[:3] == [
        "python3",
        "-m",
        "sglang.launch_server",
    ]
    assert engine.probe_command("/opt/sglang/bin/python") == [
        "/opt/sglang/bin/python",
        "-c",
        "import sglang; print(sglang.__version__)",
    ]


async def test_the_replicas_secret_reaches_sglang_on_its_command_line_the_only_place_it_reads_it(
    tmp_path: Path,
) -> None:
    spec = LaunchSpec(model="qwen-7b", port=20001, model_path="/w/qwen", secret="replica-secret")
    argv, _ = await recorded(spec, tmp_path)
    assert argv[argv.index("--api-key") + 1] == "replica-secret"
