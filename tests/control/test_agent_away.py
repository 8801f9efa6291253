"""An engine whose agent is away serves on while it answers the gateway, and leaves once it does not.

The control plane (agent service, inventory, reconciler, the gateway's engine
checks, admin API, gateway) runs in this process; node n1's agent is a real
`llmgw --role=agent` process running the sim engine as a real process. The
agent is stopped (SIGTERM, keeping its engines, or SIGSTOP) and the engine
later SIGSTOPped too: alive, its port open, answering nothing.
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

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw import config
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi import views
from llmgw.adminapi.present import model_note, replica_state, unattended_note
from llmgw.agent import state as engine_state
from llmgw.agent.client import AgentClient
from llmgw.agent.supervisor import Supervisor
from llmgw.catalog import Catalog
from llmgw.config import (
    AgentConfig,
    AuthConfig,
    ModelConfig,
    ProbeConfig,
    ProfileConfig,
    ServerConfig,
    TimeoutsConfig,
)
from llmgw.control.engine_checks import EngineChecks
from llmgw.control.inventory import UNREACHABLE, Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.control.stream.service import serve_agents
from llmgw.engines.registry import ENGINES
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache

MODEL = "sim-chat"
WAIT_S = 30.0
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
# Requests served after the node went unreachable, one after another: the load goes on past the grace.
SERVED_PAST_THE_GRACE = 40


@attrs.frozen
class Plane:
    inventory: Inventory
    port: int
    api: TestClient[Any, Any]
    gateway: TestClient[Any, Any]


@contextlib.asynccontextmanager
async def control_plane(cfg: ServerConfig) -> AsyncIterator[Plane]:
    """What the server role runs for this, in this process."""
    inventory = Inventory(grace_s=cfg.control.grace_s)
    catalog = Catalog(cfg)
    app = web.Application()
    adminapi.install(app, cfg, inventory, catalog)
    gateway = make_gateway_app(cfg, catalog, inventory, KeyCache())
    async with (
        serve_agents(cfg, inventory) as port,
        asyncio.TaskGroup() as tasks,
        TestClient(TestServer(app)) as api,
        TestClient(TestServer(gateway)) as client,
    ):
        running = [
            tasks.create_task(Reconciler(cfg, inventory, catalog, in_flight={}).run()),
            tasks.create_task(EngineChecks(inventory, cfg.control.engine_check_s).run()),
        ]
        try:
            yield Plane(inventory, port, api, client)
        finally:
            for task in running:
                task.cancel()


def _server_cfg(server_cfg: ServerConfig, **timeouts: float) -> ServerConfig:
    model = ModelConfig(
        name=MODEL,
        replicas=1,
        profiles=[ProfileConfig(engine="sim")],
        timeouts=TimeoutsConfig(**timeouts) if timeouts else TimeoutsConfig(),
    )
    return config.evolve(
        server_cfg,
        auth=AuthConfig(enabled=False),
        models=[model],
        engines={"llamacpp": ""},
        control=config.evolve(server_cfg.control, grace_s=1.0, engine_check_s=0.2),
    )


def _agent_cfg(fleet: Any, port: int, state_dir: Path) -> AgentConfig:
    return AgentConfig(
        node_id="n1",
        servers=[f"127.0.0.1:{port}"],
        state_dir=str(state_dir),
        tls=fleet.agents["n1"],
        heartbeat_interval_s=0.1,
    )


@contextlib.asynccontextmanager
async def agent_process(fleet: Any, port: int, tmp_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """`llmgw --role=agent` for n1, keeping its engines on a clean stop (the default); all killed after."""
    state_dir = tmp_path / "state"
    path = tmp_path / "agent.yaml"
    text = await asyncio.to_thread(config.dump, _agent_cfg(fleet, port, state_dir))
    await asyncio.to_thread(path.write_text, text)
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        "--role=agent",
        "--config",
        str(path),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield agent
    finally:
        if agent.returncode is None:
            agent.send_signal(signal.SIGCONT)
            agent.send_signal(signal.SIGKILL)
            await agent.wait()
        # Engines kept on stop outlive the agent: the state file says which to end.
        for record in await asyncio.to_thread(engine_state.read_state, state_dir):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGCONT)
                os.killpg(record.pid, signal.SIGKILL)


async def _engine_pid(state_dir: Path) -> int:
    [record] = await asyncio.to_thread(engine_state.read_state, state_dir)
    return record.pid


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGSTOP], ids=["stopped-cleanly", "sigstopped"])
async def test_an_engine_whose_agent_is_away_serves_past_the_grace_and_leaves_once_it_stops_answering(
    fleet, server_cfg: ServerConfig, tmp_path: Path, eventually, stop: signal.Signals
) -> None:
    cfg = _server_cfg(server_cfg)
    async with control_plane(cfg) as plane, agent_process(fleet, plane.port, tmp_path) as agent:
        inventory = plane.inventory
        await eventually(lambda: inventory.ready_endpoints(MODEL), within_s=WAIT_S)
        assert (await plane.gateway.post("/v1/chat/completions", json=CHAT)).status == 200

        agent.send_signal(stop)
        if stop == signal.SIGTERM:
            assert await agent.wait() == 0
        node = inventory.node("n1")
        assert node is not None
        # A steady load, one request after another, from before the grace runs out until well after.
        statuses: list[int] = []
        past_the_grace = 0
        while past_the_grace < SERVED_PAST_THE_GRACE:
            statuses.append((await plane.gateway.post("/v1/chat/completions", json=CHAT)).status)
            past_the_grace += node.state == UNREACHABLE
        assert set(statuses) == {200}, statuses

        [replica] = await (await plane.api.get("/api/v1/replicas")).json()
        said = views.Replica(**replica)
        assert said.agent_unreachable_s is not None
        assert replica_state(said).startswith("ready; its node's agent unreachable for ")
        [model] = await (await plane.api.get("/api/v1/models")).json()
        assert model["ready"] == 1 and model["why_not_ready"] is None
        assert "its node's agent unreachable for" in model_note(
            views.Model(**{**model, "replicas": [said], "failures": []})
        )
        status = await (await plane.api.get("/api/v1/status")).json()
        assert status["agent_unreachable"] == 1
        assert unattended_note(views.Status(**{**status, "agent_unreachable": 1})) == (
            " (1 whose node's agent is unreachable)"
        )

        # Now the engine stops too: the gateway's own check takes it out, with nobody to say so.
        os.kill(await _engine_pid(tmp_path / "state"), signal.SIGSTOP)
        await eventually(lambda: not inventory.ready_endpoints(MODEL), within_s=WAIT_S)
        refused = await plane.gateway.post("/v1/chat/completions", json=CHAT)
        assert refused.status == 503
        assert "ready on n1, which is unreachable" in (await refused.json())["error"]["message"]


async def test_an_engine_that_stops_answering_the_gateway_leaves_routing_while_its_agent_says_ready(
    fleet, server_cfg: ServerConfig, tmp_path: Path, eventually
) -> None:
    """Agent probes all but off: only the gateway, waiting on the engine, can tell it has stopped."""
    cfg = _server_cfg(server_cfg, first_byte_s=1.0)
    cfg = config.evolve(cfg, control=config.evolve(cfg.control, grace_s=60.0))
    agent_cfg = config.evolve(
        _agent_cfg(fleet, 0, tmp_path / "agent"), probe=ProbeConfig(interval_s=3600, progress_s=0)
    )
    async with control_plane(cfg) as plane:
        agent_cfg = config.evolve(agent_cfg, servers=[f"127.0.0.1:{plane.port}"])
        async with (
            Supervisor(
                ENGINES,
                ready_timeout_s=WAIT_S,
                state_dir=tmp_path / "agent",
                probe=agent_cfg.probe,
                node="n1",
            ) as supervisor,
            asyncio.TaskGroup() as tasks,
        ):
            client = AgentClient(agent_cfg, supervisor, {"sim": "builtin"}, backoff_base_s=0.05)
            running = tasks.create_task(client.run())
            try:
                inventory = plane.inventory
                await eventually(lambda: inventory.ready_endpoints(MODEL), within_s=WAIT_S)
                [status] = supervisor.statuses()
                os.kill(status.pid, signal.SIGSTOP)
                try:
                    stalled = await plane.gateway.post("/v1/chat/completions", json=CHAT)
                    assert stalled.status == 504
                    assert "(timeouts.first_byte_s)" in (await stalled.json())["error"]["message"]
                    assert inventory.ready_endpoints(MODEL) == ()
                    assert inventory.node("n1").state != UNREACHABLE  # type: ignore[union-attr]
                    assert [r.state for r in inventory.replicas(MODEL)] == ["ready"]
                    assert (await plane.gateway.post("/v1/chat/completions", json=CHAT)).status == 503
                finally:
                    os.kill(status.pid, signal.SIGCONT)
            finally:
                running.cancel()
