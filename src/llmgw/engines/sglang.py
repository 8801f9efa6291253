"""The SGLang adapter: the command line of `python -m sglang.launch_server` for one replica or rank.

SGLang is a Python package, so the binary llmgw runs is the interpreter of
the environment it is installed in (agent.yaml `engines.sglang.binary`). A
replica over several nodes runs one launch_server per node with the total
tensor-parallel size, the number of nodes, its rank and rank 0's address.
"""

from __future__ import annotations

from typing import ClassVar

from llmgw.engines.base import (
    COUNT_TOKENS,
    MESSAGES,
    OPENAI_APIS,
    RERANK,
    RESPONSES,
    Engine,
    HelpCommand,
    LaunchSpec,
)
from llmgw.errors import LlmgwError


class SglangEngine(Engine):
    """SGLang's OpenAI-compatible server, run by the interpreter it is installed in."""

    name = "sglang"
    health_path = "/health"
    metrics_path = "/metrics"
    embedding_args: tuple[str, ...] = ("--is-embedding",)
    # A Hugging Face directory; a GGUF file too (SGLang's --model-path takes one).
    weights_formats: ClassVar[frozenset[str] | None] = frozenset({"safetensors", "gguf"})
    # As vLLM's: torch, the weights, then the CUDA graphs, before /health answers.
    default_ready_timeout_s: ClassVar[float] = 600.0
    # `python3 -m sglang.launch_server`: the two words after the interpreter choose the program.
    help_command = HelpCommand(words=2)
    # /v1/responses and /v1/rerank since 2025; /v1/messages and its count_tokens on every server
    # since February 2026 (sgl-project/sglang#18630). It has no transcriptions.
    native_apis = OPENAI_APIS | {RESPONSES, RERANK, MESSAGES, COUNT_TOKENS}

    def command(self, spec: LaunchSpec) -> list[str]:
        """The launch_server argv for spec; a LlmgwError when a multi-node spec lacks its rank 0."""
        if not spec.model_path:
            raise LlmgwError(f"SGLang cannot serve {spec.model}: the replica has no weights on this node yet")
        # Every GPU of the replica on every node: --tp is the total, and the
        # placement gives each node of a replica as many GPUs.
        tp = max(len(spec.gpu_indices), 1) * max(spec.world_size, 1)
        argv = [
            spec.binary or "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            spec.model_path,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--served-model-name",
            spec.model,
            "--tp",
            str(tp),
            # SGLang serves no /metrics unless asked to.
            "--enable-metrics",
        ]
        if spec.context_size > 0:
            argv += ["--context-length", str(spec.context_size)]
        if spec.parallel > 0:
            argv += ["--max-running-requests", str(spec.parallel)]
        if spec.secret:
            # On the command line, because SGLang reads its key nowhere else (ServerArgs.api_key);
            # docs/engines.md says what that exposes. It leaves /health and /metrics open.
            argv += ["--api-key", spec.secret]
        if spec.world_size > 1:
            if not spec.master_addr or spec.master_port <= 0:
                raise LlmgwError(
                    f"SGLang cannot start rank {spec.rank} of {spec.model} across {spec.world_size} nodes: "
                    "the replica names no address of its rank 0"
                )
            host = f"[{spec.master_addr}]" if ":" in spec.master_addr else spec.master_addr
            argv += [
                "--nnodes",
                str(spec.world_size),
                "--node-rank",
                str(spec.rank),
                "--dist-init-addr",
                f"{host}:{spec.master_port}",
            ]
        argv += spec.args
        return argv

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """The replica's GPUs on this node, and spec.env over them."""
        env = {}
        if spec.gpu_indices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_indices)
        env.update(spec.env)
        return env

    def probe_command(self, binary: str) -> list[str]:
        """SGLang has no --version: its interpreter imports it and prints the version."""
        return [binary or "python3", "-c", "import sglang; print(sglang.__version__)"]
