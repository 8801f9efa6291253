"""The llama.cpp adapter's command line, as a stand-in llama-server receives it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import attrs
import pytest

from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.errors import LlmgwError

STAND_IN = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
"""


async def recorded(spec: LaunchSpec, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """Run the adapter's argv and environment with a stand-in binary; what it received."""
    binary = tmp_path / "llama-server"
    binary.write_text(STAND_IN)
    binary.chmod(0o755)
    record = tmp_path / "record.json"
    engine = LlamaCppEngine()
    spec = attrs.evolve(spec, binary=str(binary))
    argv = engine.command(spec)
    assert argv[0] == str(binary)
    env = {"PATH": "/usr/bin:/bin", "RECORD": str(record), **engine.environment(spec)}
    process = await asyncio.create_subprocess_exec(*argv, env=env)
    assert await process.wait() == 0
    got = json.loads(record.read_text())
    return got["argv"], got["env"]


async def test_a_cpu_replica_gets_model_address_alias_slots_no_gpu_layers_and_metrics(tmp_path: Path) -> None:
    spec = LaunchSpec(model="tiny-chat", port=4321, model_path="/w/tiny.gguf", context_size=2048)
    argv, env = await recorded(spec, tmp_path)
    assert argv == [
        "-m", "/w/tiny.gguf",
        "--host", "127.0.0.1",
        "--port", "4321",
        "--alias", "tiny-chat",
        "-np", "4",
        "-c", "2048",
        "-ngl", "0",
        "--metrics",
    ]  # fmt: skip
    # An empty list hides every GPU, so a CPU replica never takes GPU memory.
    assert env["CUDA_VISIBLE_DEVICES"] == ""


async def test_a_gpu_replica_offloads_every_layer_to_only_its_own_gpus(tmp_path: Path) -> None:
    spec = LaunchSpec(model="m", port=1, model_path="/w/m.gguf", gpu_indices=(2, 3))
    argv, env = await recorded(spec, tmp_path)
    assert argv[argv.index("-ngl") + 1] == "999"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"


async def test_the_parallel_setting_replaces_the_default_of_four(tmp_path: Path) -> None:
    argv, _ = await recorded(LaunchSpec(model="m", port=1, model_path="/m.gguf", parallel=16), tmp_path)
    assert argv[argv.index("-np") + 1] == "16"


async def test_no_context_size_leaves_llama_cpp_its_own_default(tmp_path: Path) -> None:
    argv, _ = await recorded(LaunchSpec(model="m", port=1, model_path="/m.gguf"), tmp_path)
    assert "-c" not in argv


async def test_profile_args_come_last_and_profile_env_wins(tmp_path: Path) -> None:
    spec = LaunchSpec(
        model="m",
        port=1,
        model_path="/m.gguf",
        args=("--flash-attn", "on", "-np", "8"),
        env=(("CUDA_VISIBLE_DEVICES", "7"), ("LLAMA_ARG_THREADS", "2")),
    )
    argv, env = await recorded(spec, tmp_path)
    assert argv[-4:] == ["--flash-attn", "on", "-np", "8"]
    assert env["CUDA_VISIBLE_DEVICES"] == "7"
    assert env["LLAMA_ARG_THREADS"] == "2"


def test_a_replica_without_a_model_file_is_refused_in_words() -> None:
    with pytest.raises(LlmgwError, match=r"llama\.cpp cannot serve tiny-chat: the replica has no model file"):
        LlamaCppEngine().command(LaunchSpec(model="tiny-chat", port=1))


def test_without_a_named_binary_the_one_on_path_is_run_and_probed() -> None:
    engine = LlamaCppEngine()
    assert engine.command(LaunchSpec(model="m", port=1, model_path="/m.gguf"))[0] == "llama-server"
    assert engine.probe_command("") == ["llama-server", "--version"]
    assert engine.probe_command("/opt/llama/llama-server") == ["/opt/llama/llama-server", "--version"]
    assert (engine.name, engine.health_path, engine.metrics_path) == ("llamacpp", "/health", "/metrics")


async def test_the_replicas_secret_reaches_llama_server_in_its_environment_not_its_command_line(
    tmp_path: Path,
) -> None:
    spec = LaunchSpec(model="tiny", port=20001, model_path="/w/tiny.gguf", secret="replica-secret")
    argv, env = await recorded(spec, tmp_path)
    # llama-server reads --api-key from LLAMA_API_KEY (common/arg.cpp); argv is readable by every user.
    assert env["LLAMA_API_KEY"] == "replica-secret"
    assert "replica-secret" not in argv and "--api-key" not in argv
    assert "replica-secret" not in repr(spec)
