"""A failed engine is reported with its cause in words: its exit and its own last line, a hang, a taken port.

The engines here are a fake engine binary run as a real process: one that
crashes printing what llama.cpp prints for a model it cannot load, one that
never becomes healthy, and one that finds its port taken by another program.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from llmgw.agent import logs as agent_logs
from llmgw.agent.engine_output import ENDED_KEPT
from llmgw.agent.supervisor import Supervisor
from llmgw.engines.base import Engine, LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.engines.sglang import SglangEngine
from llmgw.engines.sim import SimEngine
from llmgw.engines.vllm import VllmEngine
from llmgw.log import LogRing
from llmgw.proto.llmgw import v1 as pb

from .reports import Reports

# The fake engine: what it does is its first argument; it is given the port to listen on.
FAKE_ENGINE = """
import os, socket, sys, time
mode, port, gate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "crash":
    print("llama_model_loader: loaded meta data with 3 key-value pairs", flush=True)
    print("llama_model_load: error loading model: error: failed to load model", flush=True)
    print("llama_model_load_from_file_impl: failed to load model", flush=True)
    print("main: exiting due to model loading error", flush=True)
    sys.exit(1)
if mode == "hang":
    print("loading model tensors", flush=True)
    time.sleep(600)
# "taken" and "taken-quietly": wait for the test to take the port, then try to listen on it.
while not os.path.exists(gate):
    time.sleep(0.01)
s = socket.socket()
try:
    s.bind(("127.0.0.1", port))
except OSError:
    if mode == "taken-quietly":
        sys.exit(1)
    raise
"""


@attrs.define
class FakeEngine(Engine):
    """An engine adapter running the fake engine binary in one of its modes."""

    binary: Path
    mode: str
    gate: Path
    name: str = "fake"
    health_path: str = "/health"
    metrics_path: str = "/metrics"

    def command(self, spec: LaunchSpec) -> list[str]:
        return [sys.executable, str(self.binary), self.mode, str(spec.port), str(self.gate)]

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        return {}

    def probe_command(self, binary: str) -> list[str]:
        return [sys.executable, "--version"]


MakeSupervisor = Callable[..., Supervisor]


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
async def fake(tmp_path: Path, reports: Reports) -> AsyncIterator[Callable[..., Supervisor]]:
    """Supervisors running the fake engine in a mode; closed after the test."""
    binary = tmp_path / "fake-engine"
    binary.write_text(FAKE_ENGINE)
    made: list[Supervisor] = []

    def make(mode: str, **kwargs: Any) -> Supervisor:
        engine = FakeEngine(binary, mode, tmp_path / "go")
        kwargs.setdefault("ready_timeout_s", 60.0)
        supervisor = Supervisor({"fake": engine}, reports, state_dir=tmp_path, **kwargs)
        made.append(supervisor)
        return supervisor

    yield make
    for supervisor in made:
        await supervisor.aclose()


def _start(shard_id: str = "s1") -> pb.StartShard:
    return pb.StartShard(shard_id=shard_id, model="tiny", engine="fake")


async def test_an_engine_that_crashes_at_start_is_reported_with_its_exit_and_the_line_naming_the_error(
    fake: MakeSupervisor, reports: Reports
) -> None:
    supervisor = fake("crash")
    await supervisor.start(_start())
    failed = await reports.wait_for("failed")
    assert failed.detail == (
        "fake exited with code 1: llama_model_load: error loading model: error: failed to load model"
    )
    assert failed.last_output[-1] == "main: exiting due to model loading error"


async def test_an_engine_that_never_answers_its_health_path_is_reported_with_the_timeout_and_its_last_line(
    fake: MakeSupervisor, reports: Reports
) -> None:
    supervisor = fake("hang", ready_timeout_s=0.5)
    await supervisor.start(_start())
    failed = await reports.wait_for("failed")
    assert failed.detail == "fake did not answer /health within 0.5 s; its last line: loading model tensors"


async def _take_its_port(reports: Reports, gate: Path) -> socket.socket:
    """Listen on the port the supervisor gave the engine, then let the engine try it."""
    starting = await reports.wait_for("starting")
    match = re.search(r"on port (\d+)", starting.detail)
    assert match is not None, starting.detail
    holder = socket.socket()
    holder.bind(("127.0.0.1", int(match.group(1))))
    holder.listen()
    await asyncio.to_thread(gate.touch)
    return holder


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        pytest.param("taken", ": OSError: [Errno 98] Address already in use", id="saying-so"),
        # Nothing in its output: the port itself tells.
        pytest.param("taken-quietly", "", id="silently"),
    ],
)
async def test_an_engine_that_finds_its_port_taken_is_reported_as_such(
    fake: MakeSupervisor, reports: Reports, tmp_path: Path, mode: str, words: str
) -> None:
    supervisor = fake(mode)
    await supervisor.start(_start())
    holder = await _take_its_port(reports, tmp_path / "go")
    try:
        failed = await reports.wait_for("failed")
        port = holder.getsockname()[1]
        assert failed.detail == f"port {port} is in use: fake exited with code 1{words}"
    finally:
        holder.close()


async def test_a_port_taken_names_the_port_the_engine_bound_not_the_one_the_agent_chose(
    tmp_path: Path, reports: Reports
) -> None:
    """A profile whose args carry their own --port: the sim binds that one, and says so."""
    supervisor = Supervisor({"sim": SimEngine()}, reports, state_dir=tmp_path, ready_timeout_s=60.0)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held = holder.getsockname()[1]
        try:
            await supervisor.start(
                pb.StartShard(shard_id="s1", model="tiny", engine="sim", args=["--port", str(held)])
            )
            failed = await reports.wait_for("failed")
        finally:
            await supervisor.aclose()
    assert failed.detail.startswith(f"port {held} is in use: sim exited with code 1"), failed.detail


@pytest.mark.parametrize(
    ("engine", "line", "port"),
    [
        pytest.param(
            LlamaCppEngine(),
            "0.00.120.511 E srv    start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080",
            8080,
            id="llama.cpp",
        ),
        pytest.param(
            VllmEngine(),
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): "
            "address already in use",
            8000,
            id="vLLM",
        ),
        pytest.param(
            SglangEngine(),
            "ERROR:    [Errno 98] error while attempting to bind on address ('::', 30000, 0, 0): "
            "address already in use",
            30000,
            id="SGLang",
        ),
        pytest.param(SimEngine(), "OSError: [Errno 98] Address already in use", None, id="no-port"),
    ],
)
def test_each_engine_reads_the_port_from_its_own_bind_error(
    engine: Engine, line: str, port: int | None
) -> None:
    assert engine.says_port_taken(line)
    assert engine.port_in_line(line) == port


async def test_an_engine_that_fails_without_its_port_taken_is_not_said_to_have_a_taken_port(
    fake: MakeSupervisor, reports: Reports
) -> None:
    supervisor = fake("crash")
    await supervisor.start(_start())
    failed = await reports.wait_for("failed")
    assert "in use" not in failed.detail


async def test_the_output_of_a_failed_and_stopped_shard_can_still_be_read(
    fake: MakeSupervisor, reports: Reports
) -> None:
    supervisor = fake("crash")
    await supervisor.start(_start())
    await reports.wait_for("failed")
    # What the control plane does to a failed shard at once.
    await supervisor.stop("s1")
    assert supervisor.statuses() == []
    reply = agent_logs.answer(pb.LogsRequest(request_id="r", source="s1", lines=2), LogRing(), supervisor)
    assert reply.error == ""
    assert reply.lines == [
        "llama_model_load_from_file_impl: failed to load model",
        "main: exiting due to model loading error",
    ]
    assert "s1" in reply.sources


async def test_only_the_last_ended_shards_keep_their_output(fake: MakeSupervisor, reports: Reports) -> None:
    supervisor = fake("crash")
    shards = [f"s{i}" for i in range(ENDED_KEPT + 1)]
    for shard_id in shards:
        await supervisor.start(_start(shard_id))
        await reports.wait_for("failed", shard_id)
        await supervisor.stop(shard_id)
    assert supervisor.output(shards[0]) == []
    assert supervisor.output(shards[-1])[-1] == "main: exiting due to model loading error"
    assert supervisor.sources() == shards[1:]
