"""An on-demand model through the real server and agent roles and the sim engine: nothing runs until a
request comes, the requests that come are held while one replica starts and are then served, and the
decision, its reason and the cold start it took are on the admin API and the metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from structlog.testing import capture_logs

from llmgw import pki
from llmgw.adminapi import views
from llmgw.config import (
    AgentConfig,
    AuthConfig,
    ControlConfig,
    ModelConfig,
    ProfileConfig,
    ScaleConfig,
    ServerConfig,
    TimeoutsConfig,
    TLSConfig,
)
from llmgw.roles.agent import agent_role
from llmgw.roles.server import ServerHandle, server_role
from tests.servers import loopback_server_config

MODEL = "sim-chat"


def _agent(tmp_path: Path, pki_dir: Path, agent_port: int) -> AgentConfig:
    return AgentConfig(
        node_id="node-1",
        servers=[f"127.0.0.1:{agent_port}"],
        heartbeat_interval_s=0.2,
        state_dir=str(tmp_path / "agent"),
        keep_engines_on_stop=False,
        tls=TLSConfig(
            ca=str(pki_dir / "ca.pem"), cert=str(pki_dir / "node-1.pem"), key=str(pki_dir / "node-1-key.pem")
        ),
    )


def _server(tmp_path: Path, *args: str) -> ServerConfig:
    cfg = loopback_server_config(
        tmp_path,
        control=ControlConfig(interval_s=0.1),
        models=[
            ModelConfig(
                name=MODEL,
                profiles=[ProfileConfig(engine="sim", args=list(args))],
                scale=ScaleConfig(min=0, max=1, idle_s=3600),
                timeouts=TimeoutsConfig(cold_start_s=60),
            )
        ],
        engines={"llamacpp": ""},
    )
    pki.issue_agent(tmp_path / "pki", "node-1", tmp_path / "pki")
    return cfg


async def _chat(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello cold"}], "max_tokens": 4}
    async with session.post(f"{url}/v1/chat/completions", json=body) as reply:
        return reply.status, await reply.json()


async def test_requests_for_a_cold_model_are_held_while_one_replica_starts_and_then_served(tmp_path: Path):
    cfg = await asyncio.to_thread(_server, tmp_path)
    async with server_role(cfg) as server, agent_role(_agent(tmp_path, tmp_path / "pki", server.agent_port)):
        headers = {"Authorization": f"Bearer {await server.create_dev_key()}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.get(f"{server.admin_url}/api/v1/models") as reply:
                (before,) = await reply.json()
            assert before["wanted"] == 0 and server.inventory.replicas(MODEL) == []
            replies = await asyncio.gather(*(_chat(session, server.gateway_url) for _ in range(3)))
            assert [status for status, _ in replies] == [200, 200, 200], replies
            # The three shared one start.
            assert len(server.inventory.replicas(MODEL)) == 1
            async with session.get(f"{server.admin_url}/api/v1/models") as reply:
                (model,) = await reply.json()
            async with session.get(f"{server.admin_url}/metrics") as reply:
                page = await reply.text()
    scale = views.Scale(**{**model["scale"], "cold_start": views.ColdStart(**model["scale"]["cold_start"])})
    assert (model["wanted"], scale.replicas) == (1, 1)
    assert scale.reason == f"a request came for {MODEL}, which had no replica running"
    assert scale.cold_start is not None and scale.cold_start.node == "node-1"
    assert f'llmgw_scale_replicas{{model="{MODEL}"}} 1.0' in page
    assert f'llmgw_cold_start_seconds{{model="{MODEL}"}}' in page


async def test_a_start_that_fails_answers_the_held_request_with_the_engines_own_words(tmp_path: Path):
    # The sim refuses an argument it does not know, and exits saying so.
    cfg = await asyncio.to_thread(_server, tmp_path, "--no-such-flag")
    async with server_role(cfg) as server, agent_role(_agent(tmp_path, tmp_path / "pki", server.agent_port)):
        headers = {"Authorization": f"Bearer {await server.create_dev_key()}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            status, body = await _chat(session, server.gateway_url)
    assert status == 503, body
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == "cold_start_failed"
    assert str(error["message"]).startswith(f"{MODEL} could not be started: ")
    assert "unrecognized arguments: --no-such-flag" in str(error["message"])


async def test_a_request_held_on_a_standby_is_served_by_the_replica_the_leader_starts(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two servers on one PostgreSQL: the standby's gateway holds the request, the leader alone decides
    and starts the replica, and the standby serves the request once the leader's table shows it."""
    model = ModelConfig(
        name=MODEL,
        profiles=[ProfileConfig(engine="sim")],
        scale=ScaleConfig(min=0, max=1, idle_s=3600),
        timeouts=TimeoutsConfig(cold_start_s=60),
    )
    configs = [
        await asyncio.to_thread(
            loopback_server_config,
            tmp_path / name,
            database=postgres_url,
            auth=AuthConfig(enabled=False),
            control=ControlConfig(name=name, interval_s=0.1),
            models=[model],
            engines={"llamacpp": ""},
        )
        for name in ("cp1", "cp2")
    ]
    with capture_logs():
        async with server_role(configs[0]) as first, server_role(configs[1]) as second:
            servers = {"cp1": first, "cp2": second}
            async with aiohttp.ClientSession() as session:
                leader = await _leader(session, servers)
            pki_dir = tmp_path / leader / "pki"
            await asyncio.to_thread(pki.issue_agent, pki_dir, "node-1", pki_dir)
            standby = servers["cp2" if leader == "cp1" else "cp1"]
            async with (
                agent_role(_agent(tmp_path, pki_dir, servers[leader].agent_port)),
                aiohttp.ClientSession() as session,
            ):
                status, body = await _chat(session, standby.gateway_url)
    assert status == 200, body
    # The leader started it, once; the standby started nothing.
    assert len(servers[leader].inventory.replicas(MODEL)) == 1
    assert standby.inventory.replicas(MODEL) == []


async def _leader(session: aiohttp.ClientSession, servers: dict[str, ServerHandle]) -> str:
    """The name of the server the election made leader, once both agree on it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        said = set()
        for server in servers.values():
            async with session.get(server.admin_url + "/api/v1/status") as reply:
                said.add((await reply.json())["control_plane"]["leader"])
        if len(said) == 1 and (name := said.pop()):
            return str(name)
        assert loop.time() < deadline, "no leader was elected"
        await asyncio.sleep(0.05)


async def test_a_server_that_stops_answers_the_requests_it_holds_in_words(tmp_path: Path):
    """No node ever comes: the request is held until the server stops, and then told why, not cut off."""
    cfg = await asyncio.to_thread(_server, tmp_path)
    async with aiohttp.ClientSession() as session:
        async with server_role(cfg) as server:
            session.headers["Authorization"] = f"Bearer {await server.create_dev_key()}"
            held = asyncio.create_task(_chat(session, server.gateway_url))
            # Held, and the leader woken by it: placement has found no node.
            placed = f"{MODEL} has no ready replica: no node can run it (no node is connected)"
            for _ in range(500):
                if server.inventory.why_no_ready(MODEL) == placed:
                    break
                await asyncio.sleep(0.01)
            assert server.inventory.why_no_ready(MODEL) == placed
        status, body = await held
    assert status == 503, body
    assert body["error"]["message"] == (  # type: ignore[index]
        f"{MODEL} could not be started: this server is stopping; retry on another"
    )
