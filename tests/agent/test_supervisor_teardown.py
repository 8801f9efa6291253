"""What a supervisor with a state directory leaves running once stop() returns: nothing of its own."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest

from llmgw import launcher
from llmgw.agent import state as engine_state
from llmgw.agent.supervisor import Supervisor
from llmgw.engines.base import Engine, LaunchSpec
from llmgw.proto.llmgw import v1 as pb

from ..waiting import eventually


@attrs.define
class _SilentEngine(Engine):
    """An engine that prints a line and never answers its health path, until it is killed."""

    name: str = "shell"
    health_path: str = "/health"
    metrics_path: str = "/metrics"

    def command(self, spec: LaunchSpec) -> list[str]:
        return ["sh", "-c", "echo 'loading'; exec sleep 600"]

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        return {}


def _followers() -> list[psutil.Process]:
    """This process's `tail` children still running (the supervisor follows engine logs with tail)."""
    return [
        c
        for c in psutil.Process().children()
        if c.is_running() and c.status() != psutil.STATUS_ZOMBIE and c.name() == "tail"
    ]


def _awaiting(task: asyncio.Task[Any] | None, function: str) -> bool:
    """Whether task is suspended somewhere inside function (its chain of awaited coroutines)."""
    awaited: Any = task.get_coro() if task is not None else None
    while awaited is not None:
        code = getattr(awaited, "cr_code", None)
        if code is not None and code.co_name == function:
            return True
        awaited = getattr(awaited, "cr_await", None)
    return False


async def test_stopping_a_shard_while_its_dead_engine_is_drained_ends_the_log_follower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """An orphaned follower outlives the test's loop; collected, it warns "subprocess N is still running"."""
    follow = engine_state.follow_log

    async def follow_for_good(path: Path, pid: int) -> launcher.Process:
        # Following this test's own pid, the follower never ends by itself: the drain after the engine
        # dies then lasts its full second, and the stop below lands inside it every time.
        return await follow(path, os.getpid())

    monkeypatch.setattr(engine_state, "follow_log", follow_for_good)
    async with Supervisor({"shell": _SilentEngine()}, ready_timeout_s=30.0, state_dir=tmp_path) as supervisor:
        await supervisor.start(pb.StartShard(shard_id="s1", model="m", engine="shell"))
        shard = supervisor._shards["s1"]
        assert shard.process is not None
        os.kill(shard.process.pid, signal.SIGKILL)
        async with asyncio.timeout(10):
            while True:
                if _awaiting(shard.task, "_drain_output"):
                    break
                await asyncio.sleep(0.005)
        await supervisor.stop("s1")
        assert _followers() == []


@attrs.define
class _StubbornEngine(Engine):
    """An engine whose whole process group ignores SIGTERM, as one finishing a long stream does."""

    name: str = "stubborn"
    health_path: str = "/health"
    metrics_path: str = "/metrics"

    def command(self, spec: LaunchSpec) -> list[str]:
        return ["sh", "-c", "trap '' TERM; echo 'loading'; exec sleep 600"]

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        return {}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_forced_exit_while_a_shard_is_stopping_kills_its_engine_and_empties_the_state_file(
    tmp_path: Path,
):
    """stop() took the shard from the table before ending it, so kill_all() (a second signal) missed it.

    The engine lived on for the stop's grace, streaming with no agent, and shards.json still listed it.
    """
    async with Supervisor(
        {"stubborn": _StubbornEngine()}, ready_timeout_s=30.0, stop_grace_s=60.0, state_dir=tmp_path
    ) as supervisor:
        for shard_id in ("s1", "s2"):
            await supervisor.start(pb.StartShard(shard_id=shard_id, model="m", engine="stubborn"))
        pids = [p.pid for s in supervisor._shards.values() if (p := s.process) is not None]
        assert len(pids) == 2
        stopping = asyncio.create_task(supervisor.stop("s1"))
        await eventually(lambda: "s1" not in supervisor._shards)
        supervisor.kill_all()
        await eventually(lambda: not any(_alive(pid) for pid in pids))
        # In a thread: the forced exit writes it on the loop, as the last thing the process does.
        await asyncio.to_thread(supervisor.forget_engines)
        await stopping
        assert await asyncio.to_thread(engine_state.read_state, tmp_path) == []
