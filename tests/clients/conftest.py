"""The clients' system: a server and an agent on loopback, with a real llama-server and the sim engine.

What a person runs, in one process: the server and agent roles (real
certificates, mutual TLS), the agent starting llama-server (the build of
scripts/build-llama-server.sh, as `engines.llamacpp.binary`) on the tiny
random-weight model fetched over HTTP, and the sim engine. The clients under
test (the official SDKs, Claude Code, Codex CLI) talk to its gateway as they
would to Anthropic's or OpenAI's API; what each request cost is read back from
the store, per key.

One system for the session: starting it takes seconds, and every test has a key
of its own, so no test sees another's usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import pytest
import pytest_asyncio
from aiohttp import web

from llmgw import config, pki
from llmgw.config import AgentConfig, ServerConfig
from llmgw.roles.agent import agent_role
from llmgw.roles.server import ServerHandle, server_role
from llmgw.store.keys import create_key
from llmgw.store.usage import usage_totals
from tests import needs

ROOT = Path(__file__).resolve().parents[2]
# The tiny model on llama-server, and the sim engine (which echoes the prompt's last words).
TINY = "tiny"
SIM = "sim-chat"
MODELS = (TINY, SIM)
NODE = "client-node"
# Claude Code's request holds 3,208 prompt tokens of the tiny model's vocabulary and Codex's about
# 10,000: the model says it was trained on this many (make_tiny_gguf.py --context), the most
# llama-server gives a slot, and its two slots share twice that.
CONTEXT = 32768
# What the tiny model says, whatever it is asked: its weights are random, and left to itself it
# writes until the request's max_tokens (Claude Code asks for 32,000). The words are nonsense
# either way; what the tests hold is that every turn ends, in each API's own protocol.
GRAMMAR = 'root ::= "Hi there."'
# Installing nothing (the build is given), the 5 MB model fetched and loaded: seconds, on two busy cores more.
START_S = 180.0
USAGE_S = 30.0
# A client's turn takes a second or two; one waiting on a refusal it retries would take minutes.
CLIENT_S = 120.0


@attrs.frozen
class Key:
    plaintext: str
    id: int


@attrs.frozen
class Usage:
    """What the store has charged one key: its requests and their tokens."""

    requests: int
    prompt_tokens: int
    completion_tokens: int


@attrs.define
class System:
    server: ServerHandle
    _names: itertools.count[int] = attrs.field(factory=itertools.count)

    @property
    def url(self) -> str:
        return self.server.gateway_url

    async def key(self) -> Key:
        """A key of its own, usable at once."""
        plaintext, record = await create_key(self.server.store, f"client-{next(self._names)}")
        await self.server.keys.refresh(self.server.store)
        return Key(plaintext, record.id)

    async def usage(self, key: Key) -> Usage:
        totals = [t for t in await usage_totals(self.server.store, "key") if t.group == key.id]
        if not totals:
            return Usage(0, 0, 0)
        (total,) = totals
        return Usage(total.requests, total.prompt_tokens, total.completion_tokens)

    async def charged(self, key: Key, want: Usage) -> None:
        """Wait for the store to charge key exactly want (usage is written in batches), or fail."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + USAGE_S
        while (got := await self.usage(key)) != want:
            if loop.time() > deadline:
                pytest.fail(f"after {USAGE_S:g} s the store charges the key {got}, not {want}")
            # Polling what no event announces: the recorder's next batch.
            await asyncio.sleep(0.1)


@attrs.frozen
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def run(argv: Sequence[str | Path], env: dict[str, str], cwd: Path) -> Ran:
    """Run a command-line client to its end, nothing on its stdin (as in a script), on the loop's terms."""
    process = await asyncio.create_subprocess_exec(
        *map(str, argv),
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(CLIENT_S):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        pytest.fail(f"{argv[0]} did not finish in {CLIENT_S:g} s:\n{out.decode()}\n{err.decode()}")
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


def _write_tiny_model(out: Path) -> str:
    """The tiny random-weight llama GGUF (scripts/make_tiny_gguf.py), with CONTEXT; its sha256."""
    subprocess.run(
        [
            *(sys.executable, str(ROOT / "scripts" / "make_tiny_gguf.py")),
            *("--vocab", str(needs.LLAMA_BUILD / "ggml-vocab-llama-spm.gguf")),
            *("--context", str(CONTEXT), "--out", str(out)),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return hashlib.sha256(out.read_bytes()).hexdigest()


def _make_pki(pki_dir: Path) -> None:
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", ["127.0.0.1", "localhost"], pki_dir)
    pki.issue_agent(pki_dir, NODE, pki_dir)


@contextlib.asynccontextmanager
async def _serve_weights(weights: Path) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_static("/models/", weights)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}/models"
    finally:
        await runner.cleanup()


def _server_yaml(tmp: Path, weights_url: str, sha: str) -> str:
    pki_dir = tmp / "pki"
    return f"""\
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
agent_listen: 127.0.0.1:0
state_dir: {tmp / "server"}
tls:
  ca: {pki_dir / "ca.pem"}
  cert: {pki_dir / "server.pem"}
  key: {pki_dir / "server-key.pem"}
control:
  interval_s: 0.5
models:
  - name: {TINY}
    source: {weights_url}/tiny.gguf
    sha256:
      tiny.gguf: {sha}
    profiles:
      - engine: llamacpp
        args: [--threads, "2", -c, "{2 * CONTEXT}", -np, "2", --grammar, '{GRAMMAR}']
  - name: {SIM}
    profiles:
      - engine: sim
"""


def _agent_yaml(tmp: Path, agent_port: int) -> str:
    pki_dir = tmp / "pki"
    return f"""\
node_id: {NODE}
servers: ["127.0.0.1:{agent_port}"]
state_dir: {tmp / "agent"}
heartbeat_interval_s: 0.5
ready_timeout_s: {START_S}
keep_engines_on_stop: false
engines:
  llamacpp:
    binary: {needs.LLAMA_BUILD / "bin" / "llama-server"}
tls:
  ca: {pki_dir / "ca.pem"}
  cert: {pki_dir / f"{NODE}.pem"}
  key: {pki_dir / f"{NODE}-key.pem"}
"""


def _state(server: ServerHandle) -> str:
    lines = [f"{model}: {server.inventory.why_no_ready(model)}" for model in MODELS]
    for model in MODELS:
        lines += [f"replica {r.shard_id} {r.state}: {r.detail}" for r in server.inventory.replicas(model)]
    return "\n".join(lines)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def system(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    """The server and agent, once both models have a ready replica."""
    tmp = tmp_path_factory.mktemp("clients")
    weights = tmp / "weights"
    weights.mkdir()
    sha = await asyncio.to_thread(_write_tiny_model, weights / "tiny.gguf")
    await asyncio.to_thread(_make_pki, tmp / "pki")
    async with contextlib.AsyncExitStack() as stack:
        weights_url = await stack.enter_async_context(_serve_weights(weights))
        server_yaml = tmp / "server.yaml"
        await asyncio.to_thread(server_yaml.write_text, _server_yaml(tmp, weights_url, sha))
        server_cfg = await asyncio.to_thread(config.load, ServerConfig, server_yaml)
        server = await stack.enter_async_context(server_role(server_cfg))
        agent_yaml = tmp / "agent.yaml"
        await asyncio.to_thread(agent_yaml.write_text, _agent_yaml(tmp, server.agent_port))
        agent_cfg = await asyncio.to_thread(config.load, AgentConfig, agent_yaml)
        await stack.enter_async_context(agent_role(agent_cfg))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_S
        while not all(server.inventory.ready_endpoints(model) for model in MODELS):
            if loop.time() > deadline:
                pytest.fail(f"the models had no ready replica after {START_S:g} s:\n{_state(server)}")
            # Polling what no event announces: another process's progress.
            await asyncio.sleep(0.2)
        yield System(server)


@pytest_asyncio.fixture(loop_scope="session")
async def key(system: System) -> Key:
    """A key of this test's own: the store's usage for it is this test's."""
    return await system.key()
