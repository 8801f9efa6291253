"""The supervisor starts engines as real processes, watches them, restarts and stops them."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import psutil
import pytest

from llmgw.agent.supervisor import Supervisor
from llmgw.agent.watch import Watcher
from llmgw.config import AgentConfig, ProbeConfig
from llmgw.engines.base import Engine, LaunchSpec
from llmgw.engines.registry import ENGINES
from llmgw.proto.llmgw import v1 as pb

WAIT_S = 60.0


class Reports:
    """Every status the supervisor reported, and a way to wait for the next one that matches."""

    def __init__(self) -> None:
        self.statuses: list[pb.ShardStatus] = []
        self._changed = asyncio.Event()

    def __call__(self, status: pb.ShardStatus) -> None:
        self.statuses.append(status)
        self._changed.set()

    async def wait_for(
        self, state: str, shard_id: str = "s1", *, after: int = 0
    ) -> tuple[int, pb.ShardStatus]:
        """The first report at index >= after of shard_id in state, and its index."""
        async with asyncio.timeout(WAIT_S):
            while True:
                for i, status in enumerate(self.statuses[after:], after):
                    if status.shard_id == shard_id and status.state == state:
                        return i, status
                self._changed.clear()
                await self._changed.wait()

    def states(self, shard_id: str = "s1") -> list[str]:
        return [s.state for s in self.statuses if s.shard_id == shard_id]


@attrs.define
class ShellEngine(Engine):
    """An engine that is a shell script; {port} and {python} are filled in."""

    script: str
    name: str = "shell"
    health_path: str = "/health"
    metrics_path: str = "/metrics"

    def command(self, spec: LaunchSpec) -> list[str]:
        return ["sh", "-c", self.script.format(port=spec.port, python=sys.executable)]

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        return {}

    def probe_command(self, binary: str) -> list[str]:
        return ["sh", "--version"]


def _start(shard_id: str = "s1", engine: str = "sim", model: str = "sim-chat") -> pb.StartShard:
    return pb.StartShard(shard_id=shard_id, model=model, engine=engine)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def _eventually(check: Callable[[], bool]) -> None:
    """Poll check until it holds; fail after WAIT_S. For things no event announces (other processes)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            if check():
                return
            await asyncio.sleep(0.02)


async def _wait_gone(pids: list[int]) -> None:
    """Wait until none of pids runs (a zombie nobody reaped yet counts as gone)."""
    await _eventually(lambda: all(_gone(pid) for pid in pids))


async def _descendants(pid: int, count: int) -> list[int]:
    """pid's descendants, once there are at least count of them."""
    await _eventually(lambda: len(psutil.Process(pid).children(recursive=True)) >= count)
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


async def _chat(endpoint: str, content: str) -> dict[str, Any]:
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": content}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(endpoint + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        reply: dict[str, Any] = await response.json()
        return reply


MakeSupervisor = Callable[..., Supervisor]


@pytest.fixture
async def reports() -> Reports:
    return Reports()


@pytest.fixture
async def supervisors(reports: Reports, tmp_path: Path) -> AsyncIterator[MakeSupervisor]:
    """Make supervisors that report to `reports` and are closed after the test."""
    made: list[Supervisor] = []

    def make(engines: Any = ENGINES, **kwargs: Any) -> Supervisor:
        kwargs.setdefault("ready_timeout_s", WAIT_S)
        kwargs.setdefault("state_dir", tmp_path)
        supervisor = Supervisor(engines, reports, **kwargs)
        made.append(supervisor)
        return supervisor

    yield make
    for supervisor in made:
        await supervisor.aclose()


async def test_a_sim_engine_becomes_ready_and_answers_a_chat_completion(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    supervisor = supervisors()
    await supervisor.start(_start())
    _, ready = await reports.wait_for("ready")
    assert ready.endpoint.startswith("http://127.0.0.1:")
    assert ready.model == "sim-chat" and ready.engine == "sim" and ready.pid > 0
    reply = await _chat(ready.endpoint, "hello from the supervisor test")
    assert reply["choices"][0]["message"]["content"] == "hello from the supervisor test"
    assert reports.states() == ["starting", "ready"]
    assert supervisor.statuses() == [ready]
    assert supervisor.sources() == ["s1"]
    # The engine may answer /health before the supervisor has read the line it wrote on starting.
    await _eventually(lambda: any("serving sim-chat" in line for line in supervisor.output("s1")))


async def test_starting_a_running_shard_again_leaves_it_alone(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    supervisor = supervisors()
    await supervisor.start(_start())
    _, ready = await reports.wait_for("ready")
    await supervisor.start(_start())
    assert reports.states() == ["starting", "ready"]
    assert supervisor.statuses()[0].pid == ready.pid


async def test_a_crashed_engine_is_reported_with_its_last_output_and_left_to_the_control_plane(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    """Not restarted here: the control plane places it again, on this node only after its backoff."""
    supervisor = supervisors()
    await supervisor.start(_start())
    _, first = await reports.wait_for("ready")
    os.kill(first.pid, signal.SIGKILL)
    _, failed = await reports.wait_for("failed")
    assert failed.detail == "sim was killed by SIGKILL after serving"
    assert any("serving sim-chat" in line for line in failed.last_output)
    await _wait_gone([first.pid])
    assert reports.states() == ["starting", "ready", "failed"]
    assert supervisor.statuses() == [failed]
    # Asked again (the control plane's retry), it starts afresh.
    await supervisor.start(_start())
    i, _ = await reports.wait_for("starting", after=2)
    _, second = await reports.wait_for("ready", after=i)
    reply = await _chat(second.endpoint, "back again")
    assert reply["choices"][0]["message"]["content"] == "back again"
    # What the agent's metrics page counts.
    assert supervisor.restarts == {"sim-chat": 1}


async def test_stopping_ends_the_whole_process_group(supervisors: MakeSupervisor, reports: Reports) -> None:
    script = "{python} -m llmgw.engines.sim --port {port} --model m & sleep 600; wait"
    supervisor = supervisors({"shell": ShellEngine(script)})
    await supervisor.start(_start(engine="shell"))
    _, ready = await reports.wait_for("ready")
    children = await _descendants(ready.pid, 2)
    await supervisor.stop("s1")
    await _wait_gone([ready.pid, *children])
    _, stopped = await reports.wait_for("stopped")
    assert stopped.detail.startswith("stopped (shell ")
    assert supervisor.statuses() == []


async def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    script = "trap '' TERM; echo ignoring TERM; sleep 600 & wait"
    supervisor = supervisors({"shell": ShellEngine(script)}, stop_grace_s=0.2)
    await supervisor.start(_start(engine="shell"))
    _, starting = await reports.wait_for("starting")
    children = await _descendants(starting.pid, 1)
    await supervisor.stop("s1")
    await _wait_gone([starting.pid, *children])
    _, stopped = await reports.wait_for("stopped")
    assert stopped.detail == "stopped (shell was killed by SIGKILL)"


async def test_kill_all_kills_every_process_group_at_once(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    script = "trap '' TERM; echo ignoring TERM; sleep 600 & wait"
    supervisor = supervisors({"shell": ShellEngine(script)})
    await supervisor.start(_start(engine="shell"))
    _, starting = await reports.wait_for("starting")
    children = await _descendants(starting.pid, 1)
    supervisor.kill_all()
    await _wait_gone([starting.pid, *children])


async def test_an_engine_that_never_becomes_healthy_is_reported_failed_with_its_last_output(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    script = "echo loading weights; echo out of memory >&2; exec sleep 600"
    supervisor = supervisors({"shell": ShellEngine(script)}, ready_timeout_s=0.5)
    await supervisor.start(_start(engine="shell"))
    _, failed = await reports.wait_for("failed")
    assert failed.detail == "shell did not answer /health within 0.5 s; its last line: out of memory"
    assert failed.last_output == ["loading weights", "out of memory"]
    await _wait_gone([failed.pid])
    assert reports.states() == ["starting", "failed"]
    assert supervisor.statuses() == [failed]
    # Never served, so never restarted: not a restart.
    assert supervisor.restarts == {}


class SlowStarter(ShellEngine):
    """A shell engine whose own ready timeout is short, as vLLM's is long."""

    default_ready_timeout_s = 0.5


async def test_an_engine_gets_its_own_ready_timeout_when_agent_yaml_sets_none(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    supervisor = supervisors({"shell": SlowStarter("exec sleep 600")}, ready_timeout_s=0.0)
    await supervisor.start(_start(engine="shell"))
    _, failed = await reports.wait_for("failed")
    assert failed.detail == "shell did not answer /health within 0.5 s"


def test_vllm_and_sglang_are_given_longer_to_start_than_llamacpp_unless_agent_yaml_says() -> None:
    def watcher(ready_timeout_s: float) -> Watcher:
        return Watcher(
            lambda _: None,
            probe=ProbeConfig(),
            node="n1",
            ready_timeout_s=ready_timeout_s,
            health_interval_s=0.1,
            stop_grace_s=1.0,
        )

    # agent.yaml without the key: each engine's own.
    unset = watcher(AgentConfig().ready_timeout_s)
    assert unset.ready_timeout_s(ENGINES["llamacpp"]) == 120.0
    assert unset.ready_timeout_s(ENGINES["vllm"]) == 600.0
    assert unset.ready_timeout_s(ENGINES["sglang"]) == 600.0
    # A value there holds for every engine.
    assert watcher(90.0).ready_timeout_s(ENGINES["vllm"]) == 90.0
    assert watcher(90.0).ready_timeout_s(ENGINES["llamacpp"]) == 90.0


async def test_an_engine_that_exits_while_starting_is_reported_failed_and_not_restarted(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    script = "echo 'unknown flag --frobnicate' >&2; exit 3"
    supervisor = supervisors({"shell": ShellEngine(script)})
    await supervisor.start(_start(engine="shell"))
    _, failed = await reports.wait_for("failed")
    assert failed.detail == "shell exited with code 3: unknown flag --frobnicate"
    assert failed.last_output == ["unknown flag --frobnicate"]
    await supervisor.stop("s1")
    assert reports.states() == ["starting", "failed", "stopped"]


async def test_a_shard_that_failed_for_good_starts_afresh_when_asked_again(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    supervisor = supervisors({"shell": ShellEngine("exit 1")})
    await supervisor.start(_start(engine="shell"))
    i, _ = await reports.wait_for("failed")
    await supervisor.start(_start(engine="shell"))
    await reports.wait_for("failed", after=i + 1)
    assert reports.states() == ["starting", "failed", "stopped", "starting", "failed"]


async def test_an_unknown_engine_is_reported_failed(supervisors: MakeSupervisor, reports: Reports) -> None:
    supervisor = supervisors()
    await supervisor.start(_start(engine="tgi"))
    _, failed = await reports.wait_for("failed")
    assert failed.detail == "this node has no engine called 'tgi' (it has: llamacpp, sglang, sim, vllm)"


async def test_a_missing_binary_is_reported_failed(supervisors: MakeSupervisor, reports: Reports) -> None:
    @attrs.define
    class Missing(ShellEngine):
        def command(self, spec: LaunchSpec) -> list[str]:
            return ["/nonexistent/llama-server"]

    supervisor = supervisors({"shell": Missing("")})
    await supervisor.start(_start(engine="shell"))
    _, failed = await reports.wait_for("failed")
    assert failed.detail == "could not start shell: /nonexistent/llama-server: No such file or directory"


async def test_the_output_keeps_the_last_500_lines(
    supervisors: MakeSupervisor, reports: Reports, tmp_path: Path
) -> None:
    """The engine writes to its log file, which `tail` follows into the ring of 500 lines."""
    script = 'i=0; while [ $i -lt 600 ]; do echo "line $i"; i=$((i+1)); done; exec sleep 600'
    supervisor = supervisors({"shell": ShellEngine(script)})
    await supervisor.start(_start(engine="shell"))
    await _eventually(lambda: supervisor.output("s1")[-1:] == ["line 599"])
    lines = supervisor.output("s1")
    assert len(lines) == 500
    assert lines[0] == "line 100"
    assert supervisor.output("no-such-shard") == []
    log_file = await asyncio.to_thread((tmp_path / "shards" / "s1.log").read_text)
    assert log_file.splitlines()[0] == "line 0"


async def test_closing_stops_every_engine(reports: Reports, tmp_path: Path) -> None:
    async with Supervisor(ENGINES, reports, ready_timeout_s=WAIT_S, state_dir=tmp_path) as supervisor:
        await supervisor.start(_start("a"))
        await supervisor.start(_start("b"))
        _, a = await reports.wait_for("ready", "a")
        _, b = await reports.wait_for("ready", "b")
        assert a.endpoint != b.endpoint
    await _wait_gone([a.pid, b.pid])
    assert sorted(s.shard_id for s in reports.statuses if s.state == "stopped") == ["a", "b"]
    with pytest.raises(RuntimeError, match="closed"):
        await supervisor.start(_start("c"))


async def test_a_shard_stopped_while_it_is_being_spawned_does_not_outlive_the_stop(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    supervisor = supervisors()
    starting = asyncio.create_task(supervisor.start(_start()))
    await asyncio.sleep(0)  # let start() reach the spawn
    await supervisor.stop("s1")
    await starting
    pids = [s.pid for s in reports.statuses if s.pid]
    await _wait_gone(pids)
    assert reports.states()[-1] == "stopped"
    assert supervisor.statuses() == []


@attrs.define
class RecordingEngine(ShellEngine):
    """A shell engine that keeps every LaunchSpec it was asked to build a command for."""

    specs: list[LaunchSpec] = attrs.Factory(list)

    def command(self, spec: LaunchSpec) -> list[str]:
        self.specs.append(spec)
        return super().command(spec)


async def test_a_shard_that_sets_no_parallel_gets_the_one_agent_yaml_gives_its_engine(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    engine = RecordingEngine("exit 0")
    supervisor = supervisors({"shell": engine}, parallel=lambda name: {"shell": 6}[name])
    await supervisor.start(_start("a", engine="shell"))
    await supervisor.start(_start("b", engine="shell"))
    explicit = _start("c", engine="shell")
    explicit.parallel = 2
    await supervisor.start(explicit)
    for shard_id in ("a", "b", "c"):
        await reports.wait_for("failed", shard_id)
    assert [spec.parallel for spec in engine.specs] == [6, 6, 2]


async def test_an_adapter_that_refuses_a_shard_fails_that_shard_and_nothing_else(
    supervisors: MakeSupervisor, reports: Reports
) -> None:
    supervisor = supervisors()
    # llama.cpp with no weights fetched: the adapter raises rather than start a server with no model.
    await supervisor.start(_start("no-weights", engine="llamacpp", model="tiny"))
    _, failed = await reports.wait_for("failed", "no-weights")
    assert failed.detail == "llama.cpp cannot serve tiny: the replica has no model file on this node yet"
    assert reports.states("no-weights") == ["failed"]
    await supervisor.start(_start())
    await reports.wait_for("ready")
