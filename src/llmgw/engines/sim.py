"""The sim engine adapter: how the supervisor starts llmgw's own OpenAI-compatible sim.

`python -m llmgw.engines.sim --port P --model NAME [--ttft-ms N] [--tokens-per-s N]
[--host H]` runs the server itself (engines/sim_server.py); StartShard args are
appended to that command line, so a catalog profile can set the delays.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import ClassVar

from llmgw.engines.base import APIS, HOST_WHY, PORT_WHY, Engine, HelpCommand, LaunchSpec
from llmgw.engines.progress import ProgressMetrics
from llmgw.engines.sim_words import API_KEY_ENV, COMPLETION_TOKENS_METRIC, IN_FLIGHT_METRIC


class SimEngine(Engine):
    """Runs the sim with the agent's own interpreter: nothing to install."""

    name = "sim"
    health_path = "/health"
    metrics_path = "/metrics"
    embedding_args: tuple[str, ...] = ()
    # `python -m llmgw.engines.sim`: the two words after the interpreter choose the program.
    help_command = HelpCommand(words=2)
    progress = ProgressMetrics(IN_FLIGHT_METRIC, (COMPLETION_TOKENS_METRIC,))
    # Its secret comes only through the environment; it has no flag for one.
    agent_flags: ClassVar[Mapping[str, str]] = {"--host": HOST_WHY, "--port": PORT_WHY}
    # Every API, so that dev mode and the tests serve them all without a real engine.
    native_apis = APIS

    def command(self, spec: LaunchSpec) -> list[str]:
        """The sim's argv for spec; spec.args (e.g. --ttft-ms 50) come last."""
        return [
            spec.binary or sys.executable,
            "-m",
            "llmgw.engines.sim",
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--model",
            spec.model,
            *spec.args,
        ]

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """spec.env, unbuffered output so the supervisor sees lines as they are written, and the secret."""
        env = {"PYTHONUNBUFFERED": "1", **dict(spec.env)}
        if spec.secret:
            env[API_KEY_ENV] = spec.secret
        return env

    def probe_command(self, binary: str) -> list[str]:
        """The argv that prints the sim's version (binary is a Python interpreter)."""
        return [binary or sys.executable, "-m", "llmgw.engines.sim", "--version"]


if __name__ == "__main__":
    from llmgw.engines.sim_server import main

    main()
