"""The vLLM adapter: the command line of `vllm serve` for one replica or one rank of it.

A replica spread over several nodes runs one `vllm serve` per node, each
given the same tensor-parallel size (every GPU of the replica, across all
nodes), the number of nodes, its rank and the address of rank 0 (vLLM's
multiprocessing executor, no Ray cluster). Only rank 0 serves HTTP; the
others run `--headless`.
"""

from __future__ import annotations

from llmgw.engines.base import Engine, HelpCommand, LaunchSpec
from llmgw.engines.progress import ProgressMetrics
from llmgw.errors import LlmgwError

API_KEY_ENV = "VLLM_API_KEY"


class VllmEngine(Engine):
    """vLLM's OpenAI-compatible server; installed by hand and named in agent.yaml."""

    name = "vllm"
    health_path = "/health"
    metrics_path = "/metrics"
    # Both move at every engine step: a long prompt's prefill counts as work too.
    progress = ProgressMetrics(
        "vllm:num_requests_running", ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
    )
    embedding_args: tuple[str, ...] = ("--runner", "pooling")
    # Since vLLM 0.10, `vllm serve --help` lists the groups of flags, not the flags.
    help_command = HelpCommand(words=1, help=("--help=all",))

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
