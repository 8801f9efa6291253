"""What every engine adapter provides to the supervisor and the installer.

An adapter knows how to turn a shard request into a command line, where the
engine answers health and metrics, and how to ask a binary what it is. It
never starts processes itself: the supervisor owns every process.
"""

from __future__ import annotations

from typing import Protocol

import attrs


@attrs.frozen
class LaunchSpec:
    """Everything an adapter needs to build one engine command line."""

    model: str
    port: int
    host: str = "127.0.0.1"
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Local path of the weights, once fetched; empty for engines that need none.
    model_path: str = ""
    gpu_indices: tuple[int, ...] = ()
    context_size: int = 0
    parallel: int = 0
    rank: int = 0
    world_size: int = 1
    master_addr: str = ""
    master_port: int = 0
    # The binary to run, when the installer or agent.yaml named one.
    binary: str = ""
    # The replica's secret (StartShard.engine_secret): the engine refuses callers without it.
    # Given through the environment where the engine reads it there: argv is world-readable.
    secret: str = attrs.field(default="", repr=False)


class Engine(Protocol):
    """An engine adapter: pure functions of a LaunchSpec, no processes."""

    name: str
    health_path: str
    metrics_path: str
    # Arguments that make the engine serve /v1/embeddings (a model of kind `embeddings`), before the
    # profile's own.
    embedding_args: tuple[str, ...]

    def command(self, spec: LaunchSpec) -> list[str]:
        """The argv that starts this engine for spec."""
        ...

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """Extra environment variables for the engine process."""
        ...

    def probe_command(self, binary: str) -> list[str]:
        """The argv that makes the binary print its version."""
        ...
