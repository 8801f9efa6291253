"""A real Prometheus scraping a running server and agent: what an operator's dashboards are built on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from llmgw import pki
from llmgw.config import (
    AgentConfig,
    AuthConfig,
    ControlConfig,
    ModelConfig,
    ProfileConfig,
    ServerConfig,
    TLSConfig,
)
from llmgw.roles.agent import agent_role
from llmgw.roles.server import server_role
from tests import needs

MODEL = "sim-chat"
REQUESTS = 7


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def prometheus(tmp_path: Path, targets: dict[str, str]) -> AsyncIterator[str]:
    """Prometheus scraping each job's host:port every second; yields its API's base URL."""
    binary = needs.program("prometheus", "prometheus")
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
        for job, target in targets.items()
    )
    config = tmp_path / "prometheus.yml"
    await asyncio.to_thread(
        config.write_text,
        f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}",
    )
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            async with asyncio.timeout(30):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


async def _query(session: aiohttp.ClientSession, api: str, query: str) -> list[dict[str, Any]]:
    try:
        async with session.get(f"{api}/api/v1/query", params={"query": query}) as reply:
            if reply.status != 200:
                return []
            body = await reply.json()
    except aiohttp.ClientConnectionError:
        # Still starting.
        return []
    return list(body["data"]["result"])


async def _until(
    session: aiohttp.ClientSession, api: str, query: str, within_s: float = 90.0
) -> list[dict[str, Any]]:
    """The query's result once it has one; fails the test after within_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        result = await _query(session, api, query)
        if result:
            return result
        assert loop.time() < deadline, f"Prometheus never had a result for {query}"
        await asyncio.sleep(0.5)


async def _chat(session: aiohttp.ClientSession, gateway: str, key: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    async with session.post(
        f"{gateway}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as reply:
        await reply.read()
        return reply.status


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    pki_dir = tmp_path / "pki"
    pki.init_ca(pki_dir)
    pki.issue_server(pki_dir, "server", ["127.0.0.1", "localhost"], pki_dir)
    pki.issue_agent(pki_dir, "node-1", pki_dir)
    (tmp_path / "server").mkdir()
    return pki_dir


async def test_prometheus_counts_requests_exactly_and_sees_histograms_and_engine_metrics(
    tmp_path: Path, pki_dir: Path
) -> None:
    ca = str(pki_dir / "ca.pem")
    server_cfg = ServerConfig(
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        agent_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        state_dir=str(tmp_path / "server"),
        tls=TLSConfig(ca=ca, cert=str(pki_dir / "server.pem"), key=str(pki_dir / "server-key.pem")),
        auth=AuthConfig(enabled=True),
        control=ControlConfig(interval_s=0.1),
        models=[ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")])],
        engines={"llamacpp": ""},
    )
    with capture_logs():
        async with server_role(server_cfg) as server, aiohttp.ClientSession() as session:
            agent_cfg = AgentConfig(
                node_id="node-1",
                servers=[f"127.0.0.1:{server.agent_port}"],
                heartbeat_interval_s=0.2,
                state_dir=str(tmp_path / "agent"),
                metrics_listen="127.0.0.1:0",
                keep_engines_on_stop=False,
                tls=TLSConfig(ca=ca, cert=str(pki_dir / "node-1.pem"), key=str(pki_dir / "node-1-key.pem")),
            )
            async with agent_role(agent_cfg) as agent:
                key = await server.create_dev_key()
                # Until a replica is ready the gateway answers 503; those are counted, as 5xx.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while (status := await _chat(session, server.gateway_url, key)) != 200:
                    assert status == 503
                    assert loop.time() < deadline, "no replica became ready"
                    await asyncio.sleep(0.05)
                for _ in range(REQUESTS - 1):
                    assert await _chat(session, server.gateway_url, key) == 200
                targets = {
                    "llmgw_server": server.metrics_url.removeprefix("http://"),
                    "llmgw_agent": agent.metrics_url.removeprefix("http://"),
                }
                async with prometheus(tmp_path, targets) as api:
                    counted = await _until(
                        session, api, f'llmgw_requests_total{{status="2xx"}} == {REQUESTS}'
                    )
                    (series,) = counted
                    assert series["metric"]["model"] == MODEL
                    assert series["metric"]["served_model"] == MODEL
                    assert series["metric"]["job"] == "llmgw_server"
                    buckets = await _until(
                        session, api, f'llmgw_request_duration_seconds_bucket{{model="{MODEL}",le="+Inf"}}'
                    )
                    # Every request is timed: the 503s while the replica started too.
                    total = await _until(session, api, "sum(llmgw_requests_total)")
                    assert float(buckets[0]["value"][1]) == float(total[0]["value"][1]) >= REQUESTS
                    ttfb = f'llmgw_time_to_first_byte_seconds_bucket{{model="{MODEL}"}}'
                    p95 = await _until(session, api, f"histogram_quantile(0.95, {ttfb})")
                    assert float(p95[0]["value"][1]) > 0
                    replicas = await _until(session, api, f'llmgw_replicas{{model="{MODEL}",state="ready"}}')
                    assert float(replicas[0]["value"][1]) == 1
                    await _until(session, api, "process_resident_memory_bytes{job='llmgw_server'}")
                    # The sim engine's own counter, through the agent's page, with its replica's labels:
                    # it saw exactly the requests that succeeded (the 503s never reached it).
                    (engine,) = await _until(
                        session, api, f'llmgw_sim_requests_total{{endpoint="chat"}} == {REQUESTS}'
                    )
                    labels = engine["metric"]
                    assert (labels["job"], labels["model"], labels["node"]) == (
                        "llmgw_agent",
                        MODEL,
                        "node-1",
                    )
                    assert labels["replica"]
                    (ready,) = await _until(session, api, 'llmgw_agent_engines{state="ready"}')
                    assert ready["metric"]["model"] == MODEL
