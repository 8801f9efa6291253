"""How long a stopped engine stays in routing, and how long until a replacement serves.

Run from the repository root: `python scripts/measure_stalls.py --runs 1`. For each setting it runs
the control plane (agent service, inventory, reconciler, gateway) in this process and node n1 as a
real agent dialling it over mutual TLS, running one sim replica, as
tests/control/test_stalled_replicas.py does; it SIGSTOPs the ready engine and prints the seconds to
the replica out of routing and to a new replica answering a chat completion through the gateway.

Settings: `defaults` (the agent's default probe and the control plane's default backoff, no
traffic), `gateway` (the same, with one request sent as the engine stops, which the gateway gives
up on after the model's `timeouts.first_byte_s`, set to 2 s here), `tests` (the fast probes and
short backoff of the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmgw import config, pki
from llmgw.adminapi import handlers as adminapi
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
    TLSConfig,
)
from llmgw.control.inventory import Inventory
from llmgw.control.reconciler import Reconciler
from llmgw.control.stream.service import serve_agents
from llmgw.engines.registry import ENGINES
from llmgw.gateway.app import make_gateway_app
from llmgw.gateway.auth import KeyCache
from tests.control.test_stalled_replicas import CHAT, FAST, MODEL, WAIT_S, Cluster

# What the gateway setting gives the model: a stopped engine is found out by the first request to it.
FIRST_BYTE_S = 2.0
SETTINGS = {
    # (probe, the control plane's base backoff, seconds of first_byte_s or None for no request)
    "defaults": (ProbeConfig(), config.ControlConfig().base_backoff_s, None),
    "gateway": (ProbeConfig(), config.ControlConfig().base_backoff_s, FIRST_BYTE_S),
    "tests": (FAST, 0.2, None),
}


class _Fleet:
    """The certificates tests/control/conftest.py makes, for n1 alone."""

    def __init__(self, root: Path) -> None:
        ca = root / "ca"
        pki.init_ca(ca)
        cert, key = pki.issue_server(ca, "control", ["127.0.0.1", "localhost"], root / "server")
        node_cert, node_key = pki.issue_agent(ca, "n1", root / "agents")
        self.server = TLSConfig(ca=str(ca / "ca.pem"), cert=str(cert), key=str(key))
        self.agents = {"n1": TLSConfig(ca=str(ca / "ca.pem"), cert=str(node_cert), key=str(node_key))}


@contextlib.asynccontextmanager
async def _cluster(fleet: _Fleet, root: Path, setting: str) -> AsyncIterator[Cluster]:
    """tests/control/test_stalled_replicas.py's cluster and sim_node, with the setting's probe,
    backoff and timeouts."""
    probe, backoff_s, first_byte_s = SETTINGS[setting]
    timeouts = TimeoutsConfig() if first_byte_s is None else TimeoutsConfig(first_byte_s=first_byte_s)
    model = ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")], timeouts=timeouts)
    cfg = ServerConfig(
        agent_listen="127.0.0.1:0",
        tls=fleet.server,
        auth=AuthConfig(enabled=False),
        models=[model],
        control=config.ControlConfig(interval_s=0.05, grace_s=5.0, base_backoff_s=backoff_s),
    )
    inventory = Inventory(grace_s=cfg.control.grace_s)
    catalog = Catalog(cfg)
    reconciler = Reconciler(cfg, inventory, catalog, in_flight={})
    app = web.Application()
    adminapi.install(app, cfg, inventory, catalog)
    gateway = make_gateway_app(cfg, catalog, inventory, KeyCache())
    state = root / "agent"
    agent_cfg = AgentConfig(
        node_id="n1",
        servers=[],
        state_dir=str(state),
        tls=fleet.agents["n1"],
        heartbeat_interval_s=0.1,
        probe=probe,
    )
    async with (
        serve_agents(cfg, inventory) as port,
        asyncio.TaskGroup() as tasks,
        Supervisor(ENGINES, ready_timeout_s=WAIT_S, state_dir=state, probe=probe, node="n1") as supervisor,
        TestClient(TestServer(app)) as api,
        TestClient(TestServer(gateway)) as client,
    ):
        agent_cfg = config.evolve(agent_cfg, servers=[f"127.0.0.1:{port}"])
        agent = AgentClient(agent_cfg, supervisor, {"sim": "builtin"}, backoff_base_s=0.05, backoff_max_s=0.2)
        running = [tasks.create_task(reconciler.run()), tasks.create_task(agent.run())]
        try:
            yield Cluster(inventory, reconciler, cfg, catalog, supervisor, api, client)
        finally:
            for task in running:
                task.cancel()


async def _until(predicate: Callable[[], object], within_s: float = 120.0) -> float:
    """The perf_counter time at which predicate() (maybe a coroutine) first held, polled every 10 ms."""
    deadline = time.perf_counter() + within_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise TimeoutError("not within the deadline")
        await asyncio.sleep(0.01)


async def _measure(setting: str, root: Path) -> tuple[float, float]:
    first_byte_s = SETTINGS[setting][2]
    async with _cluster(_Fleet(root), root, setting) as c:
        inventory = c.inventory
        await _until(lambda: inventory.ready_endpoints(MODEL))
        [first] = inventory.replicas(MODEL)
        os.kill(c.pid(first.shard_id), signal.SIGSTOP)
        stopped = time.perf_counter()
        if first_byte_s is not None:
            request = asyncio.create_task(c.gateway.post("/v1/chat/completions", json=CHAT))
        out = await _until(lambda: not inventory.ready_endpoints(MODEL))

        async def served() -> bool:
            if not any(r.shard_id != first.shard_id for r in inventory.replicas(MODEL)):
                return False
            reply = await c.gateway.post("/v1/chat/completions", json=CHAT)
            return reply.status == 200

        replaced = await _until(served)
        if first_byte_s is not None:
            print(f"  the request sent as it stopped: {(await request).status}")
    return out - stopped, replaced - stopped


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args()
    for setting in args.settings:
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                out, replaced = await _measure(setting, Path(tmp))
            print(f"{setting}: out of routing {out:.2f} s, a replacement serving {replaced:.2f} s")


if __name__ == "__main__":
    asyncio.run(main())
