"""A replica whose engine stalls while ready leaves routing at once, says why everywhere, and is replaced.

The control plane (agent service, inventory, reconciler, admin API, gateway)
runs in this process; node n1 is a real agent client and supervisor dialling it
over mutual TLS, running the sim engine as a real process, which the test stops
with SIGSTOP: alive, its port open, the kernel still accepting connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw import config
from llmgw.adminapi import handlers as adminapi
from llmgw.adminapi.explain import explain_placement
from llmgw.agent.client import AgentClient
from llmgw.agent.supervisor import Supervisor
from llmgw.catalog import Catalog
from llmgw.config import AgentConfig, AuthConfig, ModelConfig, ProbeConfig, ProfileConfig, ServerConfig
from llmgw.control.failures import GIVE_UP_AFTER
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.control.stream.service import serve_agents
from llmgw.engines.registry import ENGINES
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from llmgw.proto.llmgw import v1 as pb

MODEL = "sim-chat"
WAIT_S = 30.0
FAST = ProbeConfig(interval_s=0.05, timeout_s=0.3, failures=3, progress_s=0)
STALLED = "stalled, so its process group was killed: sim on n1 stopped answering /health "
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


@contextlib.asynccontextmanager
async def sim_node(
    fleet: Any, port: int, tmp_path: Path, probe: ProbeConfig = FAST
) -> AsyncIterator[Supervisor]:
    """Node n1, running the sim engine with fast probes."""
    cfg = AgentConfig(
        node_id="n1",
        servers=[f"127.0.0.1:{port}"],
        state_dir=str(tmp_path / "agent"),
        tls=fleet.agents["n1"],
        heartbeat_interval_s=0.1,
        probe=probe,
    )
    async with (
        Supervisor(
            ENGINES, ready_timeout_s=WAIT_S, state_dir=tmp_path / "agent", probe=cfg.probe, node=cfg.node_id
        ) as supervisor,
        asyncio.TaskGroup() as tasks,
    ):
        client = AgentClient(cfg, supervisor, {"sim": "builtin"}, backoff_base_s=0.05, backoff_max_s=0.2)
        task = tasks.create_task(client.run())
        try:
            yield supervisor
        finally:
            task.cancel()


@attrs.frozen
class Cluster:
    inventory: Inventory
    reconciler: Reconciler
    cfg: ServerConfig
    catalog: Catalog
    supervisor: Supervisor
    api: TestClient[Any, Any]
    gateway: TestClient[Any, Any]

    def pid(self, shard_id: str) -> int:
        """The pid of the shard's engine, as n1's supervisor last reported it."""
        [pid] = [s.pid for s in self.supervisor.statuses() if s.shard_id == shard_id]
        return pid


@contextlib.asynccontextmanager
async def cluster(
    fleet: Any, server_cfg: ServerConfig, tmp_path: Path, backoff_s: float, probe: ProbeConfig = FAST
) -> AsyncIterator[Cluster]:
    """A control plane wanting one sim replica, and node n1 to run it."""
    model = ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")])
    cfg = config.evolve(
        server_cfg,
        auth=AuthConfig(enabled=False),
        models=[model],
        control=config.evolve(server_cfg.control, base_backoff_s=backoff_s),
    )
    inventory = Inventory(grace_s=cfg.control.grace_s)
    catalog = Catalog(cfg)
    reconciler = Reconciler(cfg, inventory, catalog, in_flight={})
    app = web.Application()
    adminapi.install(app, cfg, inventory, catalog)
    app[adminapi.BACKOFF_KEY] = reconciler.backoff
    gateway = make_gateway_app(cfg, catalog, inventory, KeyCache())
    async with (
        serve_agents(cfg, inventory) as port,
        asyncio.TaskGroup() as tasks,
        sim_node(fleet, port, tmp_path, probe) as supervisor,
        TestClient(TestServer(app)) as api,
        TestClient(TestServer(gateway)) as client,
    ):
        running = tasks.create_task(reconciler.run())
        try:
            yield Cluster(inventory, reconciler, cfg, catalog, supervisor, api, client)
        finally:
            running.cancel()


def _routed_when_reported(inventory: Inventory) -> list[tuple[str, tuple[str, ...]]]:
    """Each state n1 reports, with the model's routing table right after the inventory took it in."""
    seen: list[tuple[str, tuple[str, ...]]] = []
    took = inventory.shard_status

    def spy(node_id: str, status: pb.ShardStatus) -> None:
        took(node_id, status)
        seen.append((status.state, tuple(inventory.ready_endpoints(MODEL))))

    inventory.shard_status = spy  # type: ignore[method-assign]
    return seen


async def test_a_stopped_engine_leaves_routing_at_once_and_says_so_in_every_surface(
    fleet, server_cfg: ServerConfig, tmp_path: Path, eventually
) -> None:
    # A long backoff: the node stays backing off, the model unserved, while the surfaces are read.
    async with cluster(fleet, server_cfg, tmp_path, backoff_s=600) as c:
        inventory = c.inventory
        seen = _routed_when_reported(inventory)
        await eventually(lambda: inventory.ready_endpoints(MODEL), within_s=WAIT_S)
        [replica] = inventory.replicas(MODEL)
        assert (await c.gateway.post("/v1/chat/completions", json=CHAT)).status == 200

        os.kill(c.pid(replica.shard_id), signal.SIGSTOP)

        await eventually(lambda: inventory.failures.recent(MODEL), within_s=WAIT_S)
        # Out of the routing table as the stall was reported, before the engine was killed.
        # The replica may be stopped after it failed (the reconciler places it again): what matters is
        # that the stall came first and the routing table was already empty when it did.
        states = [state for state, _ in seen]
        at = states.index("stalled")
        assert states[at : at + 2] == ["stalled", "failed"], states
        assert seen[at][1] == (), seen
        [failure] = inventory.failures.recent(MODEL)
        assert failure.reason.startswith(STALLED), failure.reason

        refused = await c.gateway.post("/v1/chat/completions", json=CHAT)
        assert refused.status == 503
        assert STALLED in (await refused.json())["error"]["message"]

        models = await (await c.api.get("/api/v1/models")).json()
        assert STALLED in models[0]["why_not_ready"]
        assert models[0]["failures"][0]["reason"].startswith(STALLED)
        model = c.catalog.models()[0]
        [candidate] = explain_placement(model, inventory, c.cfg, c.catalog.models(), c.reconciler.backoff())
        assert STALLED in candidate.reason
        [listed] = await (await c.api.get("/api/v1/replicas?all=1")).json()
        assert (listed["state"], listed["node"]) == ("failed", "n1")
        assert listed["detail"].startswith(STALLED)


async def test_a_stopped_engine_is_killed_and_a_new_process_serves_again(
    fleet, server_cfg: ServerConfig, tmp_path: Path, eventually
) -> None:
    async with cluster(fleet, server_cfg, tmp_path, backoff_s=0.2) as c:
        inventory = c.inventory
        await eventually(lambda: inventory.ready_endpoints(MODEL), within_s=WAIT_S)
        [first] = inventory.replicas(MODEL)
        pid = c.pid(first.shard_id)

        os.kill(pid, signal.SIGSTOP)

        await eventually(lambda: inventory.failures.recent(MODEL), within_s=WAIT_S)
        await eventually(
            lambda: any(
                r.shard_id != first.shard_id and r.state == "ready" for r in inventory.replicas(MODEL)
            ),
            within_s=WAIT_S,
        )
        [second] = inventory.replicas(MODEL)
        assert c.pid(second.shard_id) != pid
        assert inventory.ready_endpoints(MODEL) == (second.endpoint,)
        reply = await c.gateway.post("/v1/chat/completions", json=CHAT)
        assert reply.status == 200
        assert (await reply.json())["choices"][0]["message"]["content"] == "hello"


async def test_an_engine_whose_serving_loop_dies_at_every_first_request_is_given_up_on_its_node(
    fleet, server_cfg: ServerConfig, tmp_path: Path, eventually
) -> None:
    """vLLM with a head size of 16 does so: healthy, then dead at its first request, every start."""
    async with cluster(fleet, server_cfg, tmp_path, backoff_s=0.05) as c:
        inventory = c.inventory
        for n in range(GIVE_UP_AFTER):
            await eventually(lambda: inventory.ready_endpoints(MODEL), within_s=WAIT_S)
            [replica] = [r for r in inventory.replicas(MODEL) if r.state == "ready"]
            assert (await c.gateway.post("/v1/chat/completions", json=CHAT)).status == 200
            os.kill(c.pid(replica.shard_id), signal.SIGUSR1)
            await eventually(lambda n=n: len(inventory.failures.recent(MODEL)) > n, within_s=WAIT_S)
        # Not started there again: nothing left of the model on n1, and every surface says why.
        await eventually(lambda: not inventory.replicas(MODEL), within_s=WAIT_S)
        model = c.catalog.models()[0]
        [verdict] = explain_placement(model, inventory, c.cfg, c.catalog.models(), c.reconciler.backoff())
        assert verdict.reason.startswith(
            f"is given up for this profile: its replica failed there the same way 3 times in a row ({STALLED}"
        ), verdict.reason
        refused = await c.gateway.post("/v1/chat/completions", json=CHAT)
        assert refused.status == 503
        assert "is given up for this profile" in (await refused.json())["error"]["message"]
        assert not inventory.replicas(MODEL)


async def test_a_request_held_by_an_engine_whose_generation_hangs_ends_as_it_is_reported_stalled(
    fleet, server_cfg: ServerConfig, tmp_path: Path, eventually
) -> None:
    """Alive and answering /health, producing nothing: the request ends with the stall, in its words,
    not at the kill with a connection closed, nor after timeouts.first_byte_s."""
    probe = config.evolve(FAST, progress_s=0.5)
    async with cluster(fleet, server_cfg, tmp_path, backoff_s=600, probe=probe) as c:
        inventory = c.inventory
        await eventually(lambda: inventory.ready_endpoints(MODEL), within_s=WAIT_S)
        [replica] = inventory.replicas(MODEL)
        os.kill(c.pid(replica.shard_id), signal.SIGUSR2)

        resp = await c.gateway.post("/v1/chat/completions", json=CHAT)

        assert resp.status == 502
        error = (await resp.json())["error"]
        assert error["code"] == "engine_unavailable"
        assert (
            "was abandoned mid-request: its node reported it stalled: sim on n1 has had 1 request in flight "
            in (error["message"])
        ), error["message"]
