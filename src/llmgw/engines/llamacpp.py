"""The llama.cpp adapter: the command line of `llama-server` for one replica.

llama-server serves one GGUF file over an OpenAI-compatible API. What llmgw
decides for it (model file, address, name, slots, GPU layers, metrics) comes
first; the profile's args come last, so a profile can override any of it.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmgw.engines.base import LaunchSpec
from llmgw.engines.progress import ProgressMetrics
from llmgw.errors import LlmgwError

# llama-server's own default is one slot, which makes every other request
# queue behind the first: a replica that looks ready and serves one user.
DEFAULT_PARALLEL = 4

# More layers than any model has: "all of them on the GPU". A number, not
# "all", because builds older than the word take only numbers.
ALL_LAYERS = "999"

# What llama-server reads its --api-key from when the flag is absent.
API_KEY_ENV = "LLAMA_API_KEY"

# A split GGUF (model-00001-of-00003.gguf): llama-server is given the first part and finds the others.
_PART = re.compile(r"-(\d+)-of-\d+\.gguf$")


class LlamaCppEngine:
    """llama.cpp's llama-server, as installed from its release archives or named in agent.yaml."""

    name = "llamacpp"
    health_path = "/health"
    metrics_path = "/metrics"
    embedding_args: tuple[str, ...] = ("--embeddings",)
    # n_decode_total moves at every batch, prompt or generation; tokens_predicted_total only as a
    # request ends, so alone it would make a long answer look stalled.
    progress = ProgressMetrics(
        "llamacpp:requests_processing", ("llamacpp:n_decode_total", "llamacpp:tokens_predicted_total")
    )

    def command(self, spec: LaunchSpec) -> list[str]:
        """The llama-server argv for spec; a LlmgwError when spec has no model file to serve."""
        if not spec.model_path:
            raise LlmgwError(
                f"llama.cpp cannot serve {spec.model}: the replica has no model file on this node yet"
            )
        argv = [
            spec.binary or "llama-server",
            "-m",
            spec.model_path,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            # Clients ask for the catalog's name, and llama-server answers
            # /v1/models with the file name unless told otherwise.
            "--alias",
            spec.model,
            "-np",
            str(spec.parallel if spec.parallel > 0 else DEFAULT_PARALLEL),
        ]
        # 0 would mean "the context the model was trained with", which for
        # a 128k model is more KV cache than most nodes have: only an asked
        # size is passed, and without one llama.cpp's own default applies.
        if spec.context_size > 0:
            argv += ["-c", str(spec.context_size)]
        # llama.cpp offloads layers to any GPU it sees unless told not to, so
        # a replica given no GPU says 0 rather than leaving it to "auto".
        argv += ["-ngl", ALL_LAYERS if spec.gpu_indices else "0"]
        argv.append("--metrics")
        argv += spec.args
        return argv

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """The GPUs the replica was given, and spec.env over them."""
        env = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in spec.gpu_indices)}
        env.update(spec.env)
        if spec.secret:
            # llama-server reads --api-key from LLAMA_API_KEY (common/arg.cpp's set_env); /health stays open.
            env[API_KEY_ENV] = spec.secret
        return env

    def probe_command(self, binary: str) -> list[str]:
        """llama-server prints `version: 11434 (abc1234)` on --version."""
        return [binary or "llama-server", "--version"]

    def model_file(self, weights: Path) -> Path:
        """The file -m names: weights itself, or the one GGUF in a directory of weights (from the mirror).

        Blocking (it lists the directory). A model from the mirror is a directory,
        and llama-server given a directory fails with "failed to read magic".
        """
        if not weights.is_dir():
            return weights
        ggufs = sorted(p for p in weights.rglob("*.gguf") if p.is_file() and _first_part(p.name))
        if len(ggufs) != 1:
            found = ", ".join(p.relative_to(weights).as_posix() for p in ggufs) or "none"
            raise LlmgwError(
                f"llama.cpp loads one GGUF file, and the model's weights hold {len(ggufs)} ({found}); "
                "fetch only the one to serve into the mirror (`--include '*q4_k_m.gguf'`)"
            )
        return ggufs[0]


def _first_part(name: str) -> bool:
    part = _PART.search(name)
    return part is None or int(part.group(1)) == 1
