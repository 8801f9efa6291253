#!/usr/bin/env python3
"""An on-demand vLLM (CPU build) model's cold start, held and served, twice: weights fetched, then on disk.

The server and agent roles in this process, as tests/e2e/test_on_demand_llamacpp.py runs them; the
tiny random-weight Llama of make_tiny_hf_model.py as a directory on this machine's disk (served to
the node on `weights_listen`); vLLM from the cache the real-engine tests share (tests/vllm_env.py:
installed there by the agent's own installer, which this script does not run). The model is
`scale: {min: 0, max: 1, idle_s: 5}`: the first request is held while the replica starts; once it
is stopped as idle, a second request starts it again from the weights on the node's disk. Prints
each request's time to first token and the server's measure of the cold start with its parts.
A measurement, not a test.

    python scripts/measure_cold_start_vllm.py
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import openai

from llmgw import config, pki
from llmgw.config import AgentConfig, ServerConfig
from llmgw.roles.agent import agent_role
from llmgw.roles.server import ServerHandle, server_role

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.vllm_env import ENGINES, INDEX, VERSION  # noqa: E402

MODEL = "tiny-chat"
NODE = "cpu-01"


def _prepare(tmp: Path) -> Path:
    """The model's directory and the authority's files under tmp; the pki directory."""
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_hf_model.py"), "--out", str(tmp / "tiny")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    pki_dir = tmp / "pki"
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", ["127.0.0.1"], pki_dir)
    pki.issue_agent(pki_dir, NODE, pki_dir)
    return pki_dir


def _server_yaml(tmp: Path, pki_dir: Path) -> str:
    return f"""\
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
agent_listen: 127.0.0.1:0
weights_listen: 127.0.0.1:0
state_dir: {tmp / "server"}
auth: {{enabled: false}}
tls: {{ca: {pki_dir / "ca.pem"}, cert: {pki_dir / "server.pem"}, key: {pki_dir / "server-key.pem"}}}
control: {{interval_s: 0.5}}
engines: {{vllm: "{VERSION}"}}
models:
  - name: {MODEL}
    source: {tmp / "tiny"}/
    profiles:
      - engine: vllm
        args: [--max-model-len, "512"]
        env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
    scale: {{min: 0, max: 1, idle_s: 5}}
"""


def _agent_yaml(tmp: Path, pki_dir: Path, agent_port: int) -> str:
    return f"""\
node_id: {NODE}
servers: ["127.0.0.1:{agent_port}"]
state_dir: {tmp / "agent"}
heartbeat_interval_s: 0.5
ready_timeout_s: 900
keep_engines_on_stop: false
tls: {{ca: {pki_dir / "ca.pem"}, cert: {pki_dir / f"{NODE}.pem"}, key: {pki_dir / f"{NODE}-key.pem"}}}
provision: {{dir: {ENGINES}}}
engines: {{vllm: {{index_url: "{INDEX}"}}}}
"""


async def _until(check: object) -> None:
    # Polling what another process's progress decides (the agent's recheck, the engine stopping).
    while not check():  # type: ignore[operator]  # noqa: ASYNC110
        await asyncio.sleep(0.5)


async def _one_cold_start(server: ServerHandle, label: str) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{server.gateway_url}/v1", api_key="none", timeout=900, max_retries=0
    )
    async with client:
        began, first = time.perf_counter(), 0.0
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content is not None:
                first = first or time.perf_counter() - began
    async with aiohttp.ClientSession() as session, session.get(f"{server.admin_url}/api/v1/models") as reply:
        (model,) = await reply.json()
    print(f"{label}: first token after {first:.1f} s; measured {model['scale']['cold_start']}", flush=True)


async def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        pki_dir = await asyncio.to_thread(_prepare, tmp)
        (tmp / "server.yaml").write_text(_server_yaml(tmp, pki_dir))
        cfg = await asyncio.to_thread(config.load, ServerConfig, tmp / "server.yaml")
        async with server_role(cfg) as server:
            (tmp / "agent.yaml").write_text(_agent_yaml(tmp, pki_dir, server.agent_port))
            agent_cfg = await asyncio.to_thread(config.load, AgentConfig, tmp / "agent.yaml")
            async with agent_role(agent_cfg):

                def installed() -> bool:
                    node = server.inventory.node(NODE)
                    return node is not None and "vllm" in node.engine_versions

                await _until(installed)
                await _one_cold_start(server, "weights fetched")
                await _until(lambda: not server.inventory.replicas(MODEL))
                await _one_cold_start(server, "weights on disk")


if __name__ == "__main__":
    asyncio.run(main())
