"""llama.cpp: the command line of `llama-server` for one replica, its log lines, its builds.

llama-server serves one GGUF file over an OpenAI-compatible API. What llmgw
decides for it (model file, address, name, slots, GPU layers, metrics) comes
first; the profile's args come last, so a profile can override any of it.
It is the one engine the agent installs itself, from the archives of
llama.cpp's GitHub releases (`choose_build` picks which).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from llmgw.engines.base import (
    AGENT_FLAGS,
    APIS,
    RESPONSES,
    SECRET_WHY,
    Build,
    Engine,
    LaunchSpec,
    Machine,
    Recipe,
    UnsupportedError,
)
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

# llama-server's bind error: "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080".
_BIND_PORT = re.compile(r"couldn't bind .*\bport: (\d+)")

# llama.cpp's log prefix, its time and level: "0.00.055.916 E ". E and F are errors whatever the words.
_LOG_PREFIX = re.compile(r"^\d+(?:\.\d+)+ ([A-Z]) ")

# The CUDA build taken on an x64 NVIDIA node. The release carries a matching
# cudart archive, so the node needs a driver and nothing else, no toolkit.
CUDA = "12.8"


def choose_build(version: str, host: Machine) -> Build:
    """The release archives of llama.cpp version for host; UnsupportedError where none fits."""
    # The Linux builds are made on Ubuntu, but nothing about them is Ubuntu's:
    # they need glibc 2.34 and GCC 12's libstdc++, which Debian 12 and RHEL 10
    # have and RHEL 9 does not. So the distribution's name decides nothing;
    # the build is tried everywhere and ldd says whether this system loads it.
    arch = {"amd64": "x64", "arm64": "arm64"}.get(host.arch)
    if arch is None:
        raise UnsupportedError(f"llama.cpp publishes no Linux build for {host.arch or 'this architecture'}")
    packages = {"deb": ("libgomp1",), "rpm": ("libgomp",)}
    if arch == "x64" and host.nvidia_driver:
        tail = f"bin-ubuntu-cuda-{CUDA}-x64.tar.gz"
        return Build(
            variant=f"cuda-{CUDA}",
            assets=(f"llama-{version}-{tail}", f"cudart-llama-{version}-{tail}"),
            binary="llama-server",
            packages=packages,
            cpu_flags=("avx2",),
        )
    # On arm64 the CUDA build is for a newer CUDA than a driver may support,
    # so an arm64 GPU node runs the CPU build until somebody decides otherwise.
    return Build(
        variant="cpu",
        assets=(f"llama-{version}-bin-ubuntu-{arch}.tar.gz",),
        binary="llama-server",
        packages=packages,
        # The archive carries a backend per CPU generation and loads the best
        # one, down to SSE4.2; below AVX2 it runs, several times slower.
        cpu_flags=("avx2",) if arch == "x64" else (),
    )


class LlamaCppEngine(Engine):
    """llama.cpp's llama-server, as installed from its release archives or named in agent.yaml."""

    name = "llamacpp"
    health_path = "/health"
    metrics_path = "/metrics"
    embedding_args: tuple[str, ...] = ("--embeddings",)
    # Without it, /v1/rerank answers 501 "This server does not support reranking".
    rerank_args: ClassVar[tuple[str, ...]] = ("--reranking",)
    recipe = Recipe(repo="ggml-org/llama.cpp", choose=choose_build)
    # The suite's build (b11434) serves /v1/messages and its count_tokens, /v1/rerank (with --reranking)
    # and /v1/audio/transcriptions (with an audio model). Its /v1/responses stream is translated from
    # chat instead: its text events carry no output_index or content_index, and the openai SDK's
    # `responses.stream()` (the Agents SDK's way of reading a turn) fails on them with a TypeError.
    native_apis = APIS - {RESPONSES}
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

    def names_failure(self, line: str) -> bool:
        """A line logged at level E or F; for a line without llama.cpp's prefix, its words decide."""
        prefix = _LOG_PREFIX.match(line)
        if prefix is not None:
            return prefix.group(1) in "EF"
        return super().names_failure(line)

    # llama-server loads one GGUF file, never a Hugging Face directory of safetensors.
    weights_formats: ClassVar[frozenset[str] | None] = frozenset({"gguf"})

    # llama-server also reads its key from a file.
    agent_flags: ClassVar[Mapping[str, str]] = {**AGENT_FLAGS, "--api-key-file": SECRET_WHY}

    def port_in_line(self, line: str) -> int | None:
        """The port of llama-server's "couldn't bind HTTP server socket, hostname: …, port: 8080"."""
        match = _BIND_PORT.search(line)
        return int(match.group(1)) if match else super().port_in_line(line)

    def readable(self, line: str) -> str:
        """Without the time and level, and the padding llama.cpp aligns its columns with."""
        return super().readable(_LOG_PREFIX.sub("", line))

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
