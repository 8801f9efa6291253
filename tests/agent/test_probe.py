"""A ready engine that stalls is found without a request: reported stalled with why, killed, reported failed.

Real sim engines under a real supervisor, broken the ways an operator meets:
stopped with SIGSTOP (alive, its port open, the kernel still accepting), its
serving loop dead while the process lives (the sim's SIGUSR1: /health answers
500, as vLLM after an EngineDeadError), generation hung with requests in
flight (the sim's SIGUSR2). Probe intervals are small, through the config.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from llmgw.agent.probe import sample_sums
from llmgw.agent.supervisor import Supervisor
from llmgw.config import ProbeConfig
from llmgw.engines.registry import ENGINES
from llmgw.proto.llmgw import v1 as pb

from ..waiting import eventually
from .test_supervisor import Reports, ShellEngine

WAIT_S = 30.0
# Health probes that give up fast: a stall is found in well under a second.
FAST = ProbeConfig(interval_s=0.05, timeout_s=0.3, failures=3, progress_s=0)


def _start(*args: str) -> pb.StartShard:
    return pb.StartShard(shard_id="s1", model="sim-chat", engine="sim", args=list(args))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _group(leader: int) -> list[int]:
    """The pids of leader's process group, leader first (blocking: psutil reads /proc)."""
    members = [p.pid for p in psutil.process_iter() if _group_of(p.pid) == leader]
    return sorted(members, key=lambda pid: pid != leader)


def _group_of(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1


async def _chat(endpoint: str, max_tokens: int = 4) -> dict[str, Any]:
    words = " ".join(f"w{i}" for i in range(max_tokens))
    body = {"model": "sim-chat", "max_tokens": max_tokens, "messages": [{"role": "user", "content": words}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(endpoint + "/v1/chat/completions", json=body) as r,
    ):
        reply: dict[str, Any] = await r.json()
        return reply


@pytest.fixture
async def supervised(tmp_path: Path) -> AsyncIterator[tuple[Reports, list[Supervisor]]]:
    reports = Reports()
    made: list[Supervisor] = []
    yield reports, made
    for supervisor in made:
        await supervisor.aclose()


def _supervisor(
    made: list[Supervisor], reports: Reports, tmp_path: Path, probe: ProbeConfig, engines: Any = ENGINES
) -> Supervisor:
    supervisor = Supervisor(
        engines, reports, ready_timeout_s=WAIT_S, state_dir=tmp_path, probe=probe, node="n1"
    )
    made.append(supervisor)
    return supervisor


class TestStalledEngines:
    async def test_a_stopped_engine_is_reported_stalled_and_its_whole_process_group_killed(
        self, supervised: tuple[Reports, list[Supervisor]], tmp_path: Path
    ) -> None:
        """SIGSTOP leaves the port open and the kernel accepting: only the probe's timeout finds it."""
        reports, made = supervised
        # A worker in the engine's process group, as engines fork them: it must go too.
        script = "sleep 600 & exec {python} -m llmgw.engines.sim --port {port} --model sim-chat"
        supervisor = _supervisor(made, reports, tmp_path, FAST, {"sim": ShellEngine(script, name="sim")})
        await supervisor.start(_start())
        _, ready = await reports.wait_for("ready")
        group = await asyncio.to_thread(_group, ready.pid)
        assert len(group) == 2, group

        os.kill(ready.pid, signal.SIGSTOP)

        at, stalled = await reports.wait_for("stalled")
        assert stalled.detail.startswith("sim on n1 stopped answering /health "), stalled.detail
        assert "(3 probes in a row; the last: no answer within 0.3 s)" in stalled.detail
        _, failed = await reports.wait_for("failed", after=at)
        assert failed.detail == f"stalled, so its process group was killed: {stalled.detail}"
        assert all(_gone(pid) for pid in group)
        assert reports.states() == ["starting", "ready", "stalled", "failed"]
        assert supervisor.restarts["sim-chat"] == 1

    async def test_an_engine_whose_serving_loop_died_is_stalled_while_its_process_lives(
        self, supervised: tuple[Reports, list[Supervisor]], tmp_path: Path
    ) -> None:
        """vLLM's EngineDeadError: the process lives, /health and every request answer 500."""
        reports, made = supervised
        supervisor = _supervisor(made, reports, tmp_path, FAST)
        await supervisor.start(_start())
        _, ready = await reports.wait_for("ready")

        os.kill(ready.pid, signal.SIGUSR1)

        at, stalled = await reports.wait_for("stalled")
        assert stalled.detail.startswith("sim on n1 stopped answering /health "), stalled.detail
        assert stalled.detail.endswith("(3 probes in a row; the last: HTTP 500)")
        _, failed = await reports.wait_for("failed", after=at)
        assert failed.detail.startswith("stalled, so its process group was killed: sim on n1 stopped")
        await eventually(lambda: _gone(ready.pid), WAIT_S)

    async def test_an_engine_holding_requests_without_producing_a_token_is_stalled(
        self, supervised: tuple[Reports, list[Supervisor]], tmp_path: Path
    ) -> None:
        """Its /health still answers: only its token counter, not moving, gives it away."""
        reports, made = supervised
        probe = ProbeConfig(interval_s=0.05, timeout_s=1.0, failures=3, progress_s=0.5)
        supervisor = _supervisor(made, reports, tmp_path, probe)
        await supervisor.start(_start())
        _, ready = await reports.wait_for("ready")

        os.kill(ready.pid, signal.SIGUSR2)
        hung = [asyncio.create_task(_chat(ready.endpoint)) for _ in range(2)]
        try:
            _, stalled = await reports.wait_for("stalled")
        finally:
            for request in hung:
                request.cancel()
            await asyncio.gather(*hung, return_exceptions=True)
        assert stalled.detail.startswith(
            "sim on n1 has had 2 requests in flight and produced no token for "
        ), stalled.detail
        await reports.wait_for("failed")
        await eventually(lambda: _gone(ready.pid), WAIT_S)

    async def test_a_slow_engine_that_keeps_producing_tokens_is_not_stalled(
        self, supervised: tuple[Reports, list[Supervisor]], tmp_path: Path
    ) -> None:
        """An answer that takes four times the progress bound moves the counter all along."""
        reports, made = supervised
        probe = ProbeConfig(interval_s=0.05, timeout_s=1.0, failures=3, progress_s=0.5)
        supervisor = _supervisor(made, reports, tmp_path, probe)
        await supervisor.start(_start("--tokens-per-s", "20"))
        _, ready = await reports.wait_for("ready")

        reply = await _chat(ready.endpoint, max_tokens=40)

        assert reply["usage"]["completion_tokens"] == 40
        assert reports.states() == ["starting", "ready"]


class TestMetricsPages:
    def test_every_labelled_sample_of_a_name_is_summed_and_timestamps_are_ignored(self) -> None:
        page = (
            "# HELP vllm:num_requests_running Requests running.\n"
            'vllm:num_requests_running{model_name="a b",engine="0"} 2.0\n'
            'vllm:num_requests_running{model_name="c",engine="1"} 1.0 1712000000000\n'
            "vllm:generation_tokens_total 7\n"
            "vllm:generation_tokens_total_other 100\n"
        )
        sums = sample_sums(page, {"vllm:num_requests_running", "vllm:generation_tokens_total"})
        assert sums == {"vllm:num_requests_running": 3.0, "vllm:generation_tokens_total": 7.0}
