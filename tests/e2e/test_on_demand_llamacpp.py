"""An on-demand model on a real llama.cpp engine: the first request is held while the agent fetches the
weights and starts llama-server, and then served; idle, the replica is stopped, its weights kept; the
next request's cold start is the engine's start alone.

The same system as test_llamacpp.py (server and agent roles, the release stand-in, a weights host),
with the model declared `scale: {min: 0, max: 1}`. Each cold start's wait and its parts are printed
(`pytest -s`): docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import openai
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from llmgw import config
from llmgw.adminapi import views
from llmgw.config import AgentConfig, ServerConfig
from llmgw.roles.agent import agent_role
from llmgw.roles.server import ServerHandle, server_role

from .test_llamacpp import (
    NODE,
    TAG,
    WAIT_S,
    FakeGitHub,
    _eventually,
    _make_pki,
    _read_build,
    _serve,
    _write_tiny_model,
)

MODEL = "tiny-on-demand"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(4 * WAIT_S),
    pytest.mark.usefixtures("llama_server"),
]


@attrs.frozen
class System:
    server: ServerHandle
    key: str
    # Every request the weights host answered: "GET /models/tiny.gguf", with its Range when it had one.
    fetched: list[str]


def _server_yaml(tmp_path: Path, pki_dir: Path, source: str, sha: str) -> str:
    return f"""\
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
agent_listen: 127.0.0.1:0
state_dir: {tmp_path / "server"}
tls:
  ca: {pki_dir / "ca.pem"}
  cert: {pki_dir / "server.pem"}
  key: {pki_dir / "server-key.pem"}
control:
  interval_s: 0.5
engines:
  llamacpp: {TAG}
models:
  - name: {MODEL}
    source: {source}
    sha256:
      tiny.gguf: {sha}
    profiles:
      - engine: llamacpp
        args: [--threads, "2"]
    scale: {{min: 0, max: 1, idle_s: 2}}
    timeouts: {{cold_start_s: {WAIT_S}}}
"""


def _agent_yaml(tmp_path: Path, pki_dir: Path, agent_port: int, github_url: str) -> str:
    return f"""\
node_id: {NODE}
servers: ["127.0.0.1:{agent_port}"]
state_dir: {tmp_path / "agent"}
heartbeat_interval_s: 0.5
ready_timeout_s: {WAIT_S}
keep_engines_on_stop: false
tls:
  ca: {pki_dir / "ca.pem"}
  cert: {pki_dir / f"{NODE}.pem"}
  key: {pki_dir / f"{NODE}-key.pem"}
provision:
  api_url: {github_url}
  download_url: {github_url}
"""


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[System]:
    """Server and agent, llama-server installed on the node, and nothing of the model running yet."""
    archive, digest = await asyncio.to_thread(_read_build)
    pki_dir = tmp_path / "pki"
    await asyncio.to_thread(_make_pki, pki_dir)
    weights_dir = tmp_path / "models"
    weights_dir.mkdir()
    sha = await asyncio.to_thread(_write_tiny_model, weights_dir / "tiny.gguf")
    fetched: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        fetched.append(f"{request.method} {request.path} {request.headers.get('Range', '')}".strip())
        return await handler(request)

    weights_app = web.Application(middlewares=[count])
    weights_app.router.add_static("/models/", weights_dir)
    async with contextlib.AsyncExitStack() as stack:
        github = FakeGitHub(archive, digest)
        github.url = await stack.enter_async_context(_serve(github.app()))
        weights_url = await stack.enter_async_context(_serve(weights_app))
        server_yaml = tmp_path / "server.yaml"
        server_yaml.write_text(_server_yaml(tmp_path, pki_dir, f"{weights_url}/models/tiny.gguf", sha))
        server = await stack.enter_async_context(
            server_role(await asyncio.to_thread(config.load, ServerConfig, server_yaml))
        )
        agent_yaml = tmp_path / "agent.yaml"
        agent_yaml.write_text(_agent_yaml(tmp_path, pki_dir, server.agent_port, github.url))
        await stack.enter_async_context(
            agent_role(await asyncio.to_thread(config.load, AgentConfig, agent_yaml))
        )

        def installed() -> bool:
            node = server.inventory.node(NODE)
            return node is not None and "llamacpp" in node.engine_versions

        await _eventually("llama-server to be installed on the node", installed, lambda: "")
        yield System(server=server, key=await server.create_dev_key(), fetched=fetched)


async def _held_and_served(system: System) -> tuple[float, str]:
    """One streamed chat completion: (seconds to its first token, its text)."""
    client = openai.AsyncOpenAI(
        base_url=f"{system.server.gateway_url}/v1", api_key=system.key, timeout=WAIT_S, max_retries=0
    )
    async with client:
        began = time.perf_counter()
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, stream=True
        )
        first, text = 0.0, ""
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - began
                text += chunk.choices[0].delta.content
    return first, text


async def _scale(system: System) -> views.Scale:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{system.server.admin_url}/api/v1/models") as reply,
    ):
        (model,) = await reply.json()
    scale = dict(model["scale"])
    measured = scale.pop("cold_start")
    return views.Scale(**scale, cold_start=views.ColdStart(**measured) if measured else None)


async def test_a_cold_request_is_held_while_llama_server_starts_then_served_and_idle_it_stops(
    system: System,
) -> None:
    assert system.server.inventory.replicas(MODEL) == []
    ttft, text = await _held_and_served(system)
    assert text
    first = await _scale(system)
    assert first.cold_start is not None and first.cold_start.node == NODE
    print(f"\ncold start (weights fetched): first token after {ttft:.2f} s; {first.words()}")

    await _eventually(
        f"{MODEL}'s idle replica to be stopped",
        lambda: not system.server.inventory.replicas(MODEL),
        lambda: system.server.inventory.why_no_ready(MODEL),
    )
    stopped = await _scale(system)
    assert stopped.replicas == 0 and stopped.reason.startswith("no request for ")

    # The weights stayed in the node's cache: the next start fetches nothing. (The ranged reads are
    # the control plane's, reading the model's headers for its memory estimate.)
    before = list(system.fetched)
    assert before.count("GET /models/tiny.gguf") == 1, before
    ttft, text = await _held_and_served(system)
    assert text
    assert system.fetched == before
    again = await _scale(system)
    assert again.cold_start is not None
    print(f"cold start (weights on disk): first token after {ttft:.2f} s; {again.words()}")
