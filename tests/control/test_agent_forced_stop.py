"""A second signal to an agent that does not keep its engines kills the one it is stopping, and says so.

The control plane (agent service, reconciler, gateway) runs in this process; node
n1's agent is a real `llmgw --role=agent` process with keep_engines_on_stop off,
running the sim engine as a real process that streams a slow reply through the
gateway. The first SIGTERM has the agent stop that engine, which goes on
streaming before it exits; the second one, in that window, forces the agent's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from llmgw import config
from llmgw.agent import state as engine_state
from llmgw.cli.exit import EXIT_FORCED
from llmgw.config import AgentConfig, AuthConfig, ModelConfig, ProfileConfig, ServerConfig

from ..waiting import eventually, eventually_async
from .test_agent_away import control_plane

MODEL = "sim-slow"
WAIT_S = 30.0
# Two tokens a second for 500 tokens: the stream outlasts the test many times over.
SLOW_STREAM = {
    "model": MODEL,
    "stream": True,
    "max_tokens": 500,
    "messages": [{"role": "user", "content": " ".join(["word"] * 500)}],
}


@contextlib.asynccontextmanager
async def agent_process(
    fleet: Any, port: int, state_dir: Path, output: list[str]
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`llmgw --role=agent` for n1, stopping its engines when it stops; its output lines into output."""
    cfg = AgentConfig(
        node_id="n1",
        servers=[f"127.0.0.1:{port}"],
        state_dir=str(state_dir),
        tls=fleet.agents["n1"],
        heartbeat_interval_s=0.1,
        keep_engines_on_stop=False,
    )
    path = state_dir.parent / "agent.yaml"
    text = await asyncio.to_thread(config.dump, cfg)
    await asyncio.to_thread(path.write_text, text)
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        "--role=agent",
        "--config",
        str(path),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )

    async def read() -> None:
        assert agent.stdout is not None
        async for line in agent.stdout:
            output.append(line.decode(errors="replace"))

    async with asyncio.TaskGroup() as tasks:
        reader = tasks.create_task(read())
        try:
            yield agent
        finally:
            if agent.returncode is None:
                agent.send_signal(signal.SIGKILL)
                await agent.wait()
            reader.cancel()


async def _stream(gateway: Any, started: asyncio.Event) -> None:
    """A streamed chat reply, read until it ends or is cut."""
    async with gateway.post("/v1/chat/completions", json=SLOW_STREAM) as reply:
        assert reply.status == 200, await reply.text()
        # Cut when the engine is killed: that is the point.
        with contextlib.suppress(aiohttp.ClientError):
            async for _ in reply.content:
                started.set()


async def _refused(endpoint: str) -> bool:
    """Whether the engine at endpoint has stopped listening: what it does first on SIGTERM."""
    where = urlsplit(endpoint)
    try:
        _, writer = await asyncio.open_connection(where.hostname, where.port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_a_second_signal_while_the_agent_stops_a_streaming_engine_kills_it_and_empties_the_state_file(
    fleet, server_cfg: ServerConfig, tmp_path: Path
) -> None:
    """The agent took the engine from its table before stopping it, and the forced exit missed it.

    The engine lived on with no agent, and shards.json still listed it for the next agent.
    """
    model = ModelConfig(
        name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim", args=["--tokens-per-s", "2"])]
    )
    cfg = config.evolve(server_cfg, auth=AuthConfig(enabled=False), models=[model], engines={"llamacpp": ""})
    state_dir = tmp_path / "state"
    output: list[str] = []
    async with (
        control_plane(cfg) as plane,
        agent_process(fleet, plane.port, state_dir, output) as agent,
        asyncio.TaskGroup() as tasks,
    ):
        pgid = 0
        try:
            await eventually(lambda: plane.inventory.ready_endpoints(MODEL), within_s=WAIT_S)
            [record] = await asyncio.to_thread(engine_state.read_state, state_dir)
            # The engine leads its own process group: the one the agent must kill.
            pgid = record.pid
            assert os.getpgid(pgid) == pgid
            started = asyncio.Event()
            stream = tasks.create_task(_stream(plane.gateway, started))
            await asyncio.wait_for(started.wait(), WAIT_S)

            agent.send_signal(signal.SIGTERM)
            await eventually(lambda: any("a second signal forces the exit" in line for line in output))
            # The agent has SIGTERMed the engine, which stops listening and finishes its stream.
            await eventually_async(lambda: _refused(record.endpoint), within_s=WAIT_S)
            # Alive, as an engine taking its time over a long stream is: left to itself it would
            # outlive the agent for good, and the test would not depend on how long the sim takes.
            os.killpg(pgid, signal.SIGSTOP)
            agent.send_signal(signal.SIGTERM)

            assert await asyncio.wait_for(agent.wait(), WAIT_S) == EXIT_FORCED
            assert any("forced to stop: killing engines now" in line for line in output)
            await eventually(lambda: _group_gone(pgid), within_s=WAIT_S)
            assert await asyncio.to_thread(engine_state.read_state, state_dir) == []
            await asyncio.wait_for(stream, WAIT_S)
        finally:
            if pgid and not _group_gone(pgid):
                os.killpg(pgid, signal.SIGKILL)
