"""A test-only engine kind, `twin`: the sim's server started under another name.

All of it is in this one module, as a real engine's is in src/llmgw/engines/;
tests/agent/test_new_engine.py adds the one registry line.
"""

from __future__ import annotations

import sys

from llmgw.engines.base import Engine, HelpCommand, LaunchSpec
from llmgw.engines.sim_words import API_KEY_ENV


class TwinEngine(Engine):
    """The sim under the name `twin`, with a log format of its own: "TWIN! " starts a failure."""

    name = "twin"
    health_path = "/health"
    metrics_path = "/metrics"
    embedding_args: tuple[str, ...] = ()
    help_command = HelpCommand(words=2)

    def command(self, spec: LaunchSpec) -> list[str]:
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
        env = {"PYTHONUNBUFFERED": "1", **dict(spec.env)}
        if spec.secret:
            env[API_KEY_ENV] = spec.secret
        return env

    def probe_command(self, binary: str) -> list[str]:
        return [binary or sys.executable, "-m", "llmgw.engines.sim", "--version"]

    def names_failure(self, line: str) -> bool:
        return line.startswith("TWIN! ")

    def readable(self, line: str) -> str:
        return super().readable(line.removeprefix("TWIN! "))
