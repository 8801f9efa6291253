"""A real llama-server that cannot load its model, or finds its port taken, is reported in its own words.

Needs the build of scripts/build-llama-server.sh, like test_llama_server.py.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from llmgw.agent.supervisor import Supervisor
from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.proto.llmgw import v1 as pb

from ..agent.reports import Reports
from .test_llama_server import BUILD

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("llama_server"),
]

# Waits for the test to take the port it was given, then runs the real llama-server.
GATED = """#!/bin/sh
while [ ! -e "{gate}" ]; do sleep 0.01; done
exec "{binary}" "$@"
"""


@attrs.define
class WithModelFile(LlamaCppEngine):
    """The llama.cpp adapter, given a model file as the weights cache would give it."""

    model_path: Path

    def command(self, spec: LaunchSpec) -> list[str]:
        return super().command(attrs.evolve(spec, model_path=str(self.model_path)))


@pytest.fixture
async def supervisors(tmp_path: Path) -> AsyncIterator[Callable[..., tuple[Supervisor, Reports]]]:
    made: list[Supervisor] = []

    def make(model: Path, binary: Path, **kwargs: Any) -> tuple[Supervisor, Reports]:
        reports = Reports()
        supervisor = Supervisor(
            {"llamacpp": WithModelFile(model)},
            reports,
            ready_timeout_s=60.0,
            state_dir=tmp_path,
            binaries=lambda _: str(binary),
            **kwargs,
        )
        made.append(supervisor)
        return supervisor, reports

    yield make
    for supervisor in made:
        await supervisor.aclose()


def _start() -> pb.StartShard:
    return pb.StartShard(shard_id="s1", model="tiny", engine="llamacpp", args=["--threads", "1"])


async def test_a_model_file_llama_server_cannot_load_is_reported_with_its_loading_error(
    supervisors: Callable[..., tuple[Supervisor, Reports]], tmp_path: Path
) -> None:
    model = tmp_path / "broken.gguf"
    await asyncio.to_thread(model.write_bytes, b"not a gguf file at all" * 100)
    supervisor, reports = supervisors(model, BUILD / "bin" / "llama-server")
    await supervisor.start(_start())
    failed = await reports.wait_for("failed")
    assert failed.detail.startswith("llamacpp exited with code 1: "), failed.detail
    # The cause, not the "exiting due to model loading error" llama-server ends with.
    assert "invalid magic characters" in failed.detail, failed.detail


async def test_llama_server_finding_its_port_taken_is_reported_as_such(
    supervisors: Callable[..., tuple[Supervisor, Reports]], tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    wrapper = tmp_path / "llama-server"
    await asyncio.to_thread(
        wrapper.write_text, GATED.format(gate=gate, binary=BUILD / "bin" / "llama-server")
    )
    await asyncio.to_thread(wrapper.chmod, 0o755)
    model = tmp_path / "broken.gguf"
    await asyncio.to_thread(model.write_bytes, b"never read")
    supervisor, reports = supervisors(model, wrapper)
    await supervisor.start(_start())
    starting = await reports.wait_for("starting")
    match = re.search(r"on port (\d+)", starting.detail)
    assert match is not None, starting.detail
    port = int(match.group(1))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        await asyncio.to_thread(gate.touch)
        failed = await reports.wait_for("failed")
    assert failed.detail.startswith(f"port {port} is in use: llamacpp exited with code 1: "), failed.detail
    assert "couldn't bind HTTP server socket" in failed.detail, failed.detail
