"""The real agent role, with its state directory, next to a real server role: what each leaves behind."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
import psutil
import pytest

from llmgw import pki
from llmgw.agent import state
from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.config import AgentConfig, ControlConfig, ModelConfig, ProfileConfig, ServerConfig, TLSConfig
from llmgw.roles.agent import agent_role
from llmgw.roles.server import server_role

from .. import needs


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


def _followers(before: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """The `tail` processes following engine logs that this process still runs, but those in before.

    before: the followers of systems other tests keep running for the whole session (tests/clients),
    which this test's agent did not start and cannot stop.
    """
    return [
        c
        for c in psutil.Process().children()
        if c.pid not in before and _running(c.pid) and c.name() == "tail"
    ]


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
    others = frozenset(p.pid for p in _followers())
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
        assert _followers(others) == []
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


def _agent_yaml(base: Path, key: Path) -> Path:
    """agent.yaml for node-1 of base/pki, whose key is key; its state directory is base/agent."""
    pki_dir = base / "pki"
    path = base / "agent.yaml"
    path.write_text(
        f"node_id: node-1\nservers: ['127.0.0.1:9']\nstate_dir: {base / 'agent'}\n"
        f"tls:\n  ca: {pki_dir / 'ca.pem'}\n  cert: {pki_dir / 'node-1.pem'}\n  key: {key}\n"
    )
    return path


def _run_agent(config_path: Path, *as_user: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*as_user, sys.executable, "-m", "llmgw", "--role=agent", "--config", str(config_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
        timeout=60,
    )


class TestAKeyTheAgentCannotUse:
    """It ended in an asyncio.CancelledError traceback naming no file, after the engines were adopted."""

    def test_a_key_the_agent_may_not_read_exits_78_naming_it_and_starts_nothing(self) -> None:
        needs.root("reading a key as another user")
        setpriv = needs.program("setpriv", "util-linux")
        with tempfile.TemporaryDirectory() as directory:
            base = Path(directory)
            # Everything but the key readable by the agent's user, and its state directory makeable.
            base.chmod(0o777)
            pki.init_ca(base / "pki")
            pki.issue_agent(base / "pki", "node-1", base / "pki")
            (base / "pki").chmod(0o755)
            for name in ("ca.pem", "node-1.pem"):
                (base / "pki" / name).chmod(0o644)
            key = base / "pki" / "node-1-key.pem"
            done = _run_agent(
                _agent_yaml(base, key), setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"
            )
            started = (base / "agent").exists()
        assert done.returncode == EXIT_CONFIG, done.stderr
        said = done.stderr.strip().splitlines()[-1]
        assert said.startswith(f"llmgw: tls.key names {key}, which this process (uid 65534) may not read")
        assert "Traceback" not in done.stderr
        assert not started

    @pytest.mark.parametrize(
        ("key_name", "said"),
        [
            ("missing-key.pem", "tls.key names {key}, which does not exist"),
            ("a-directory", "tls.key names {key}, which is a directory, not a file"),
            ("garbage.pem", "tls.cert {cert} and tls.key {key} cannot be used together: one of them is not"),
        ],
    )
    def test_a_key_that_is_missing_or_no_key_at_all_is_named_in_words(
        self, tmp_path: Path, pki_dir: Path, key_name: str, said: str
    ) -> None:
        (tmp_path / "a-directory").mkdir()
        (tmp_path / "garbage.pem").write_text("not a key\n")
        key = tmp_path / key_name
        done = _run_agent(_agent_yaml(tmp_path, key))
        assert done.returncode == EXIT_ERROR, done.stderr
        expected = said.format(key=key, cert=pki_dir / "node-1.pem")
        assert done.stderr.strip().splitlines()[-1].startswith(f"llmgw: {expected}")
        assert "Traceback" not in done.stderr
        assert not (tmp_path / "agent").exists()
