"""The real agent role, with its state directory, next to a real server role: what each leaves behind."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
from pathlib import Path

import aiohttp
import psutil
import pytest

from llmgw import pki
from llmgw.agent import state
from llmgw.config import AgentConfig, ControlConfig, ModelConfig, ProfileConfig, ServerConfig, TLSConfig
from llmgw.roles.agent import agent_role
from llmgw.roles.server import server_role


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    pki_dir = tmp_path / "pki"
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", ["127.0.0.1", "localhost"], pki_dir)
    pki.issue_agent(pki_dir, "node-1", pki_dir)
    return pki_dir


def agent_config(tmp_path: Path, pki_dir: Path, agent_port: int, keep: bool) -> AgentConfig:
    ca = str(pki_dir / "ca.pem")
    return AgentConfig(
        node_id="node-1",
        servers=[f"127.0.0.1:{agent_port}"],
        heartbeat_interval_s=0.2,
        state_dir=str(tmp_path / "agent"),
        keep_engines_on_stop=keep,
        tls=TLSConfig(ca=ca, cert=str(pki_dir / "node-1.pem"), key=str(pki_dir / "node-1-key.pem")),
    )


async def chat(gateway_url: str, key: str) -> str:
    """One chat completion through the gateway, retried until a replica is ready (a 503 until then)."""
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hello agent"}], "max_tokens": 4}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        while True:
            async with session.post(f"{gateway_url}/v1/chat/completions", json=body) as reply:
                if reply.status == 200:
                    data = await reply.json()
                    return str(data["choices"][0]["message"]["content"])
                assert reply.status == 503, await reply.text()
            assert loop.time() < deadline, "no replica became ready within 30 s"
            await asyncio.sleep(0.05)


def _kept(state_dir: Path) -> list[state.EngineRecord]:
    return state.read_state(state_dir)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _followers() -> list[psutil.Process]:
    """The `tail` processes following engine logs that this process still runs."""
    return [c for c in psutil.Process().children() if _running(c.pid) and c.name() == "tail"]


@pytest.mark.parametrize("keep", [False, True], ids=["engines-stopped", "engines-kept"])
async def test_the_agent_role_serves_a_chat_completion_and_closes_without_a_stray_subprocess(
    tmp_path: Path, pki_dir: Path, keep: bool
):
    """filterwarnings=error turns a subprocess collected while still running into a failure."""
    server_cfg = ServerConfig(
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        agent_listen="127.0.0.1:0",
        state_dir=str(tmp_path / "server"),
        tls=TLSConfig(
            ca=str(pki_dir / "ca.pem"), cert=str(pki_dir / "server.pem"), key=str(pki_dir / "server-key.pem")
        ),
        control=ControlConfig(interval_s=0.1),
        models=[ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])],
        # Nothing to install: the sim ships inside llmgw, and this machine need not reach GitHub.
        engines={"llamacpp": ""},
    )
    (tmp_path / "server").mkdir()
    agent_dir = tmp_path / "agent"
    engines: list[state.EngineRecord] = []
    try:
        async with (
            server_role(server_cfg) as server,
            agent_role(agent_config(tmp_path, pki_dir, server.agent_port, keep)),
        ):
            assert await chat(server.gateway_url, await server.create_dev_key()) == "hello agent"
            engines = await asyncio.to_thread(_kept, agent_dir)
            assert len(engines) == 1
        # Collected now, inside the test, so that a transport left with a running child fails it here.
        gc.collect()
        assert _followers() == []
        (engine,) = engines
        if not keep:
            assert not _running(engine.pid)
            return
        # Left for the next agent: still serving, and still in the state file for it to adopt.
        assert [r.pid for r in await asyncio.to_thread(_kept, agent_dir)] == [engine.pid]
        async with aiohttp.ClientSession() as session, session.get(f"{engine.endpoint}/health") as reply:
            assert reply.status == 200
    finally:
        if keep:
            # The engine a kept run leaves behind is this test's to end, and to reap: it was spawned
            # by this process, and the agent that watched it is gone.
            for engine in engines:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(engine.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    await asyncio.to_thread(os.waitpid, engine.pid, 0)
