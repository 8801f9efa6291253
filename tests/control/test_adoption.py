"""Restarts over real streams: an agent killed while its engine serves, a server restarted, a node lost.

The server side is the agent service, the inventory and the reconciler in this
process; agents are either real `llmgw --role=agent` processes (to be killed
outright) or a supervisor and client in this process. Engines are the sim, as
real processes on loopback ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psutil

from llmgw import config
from llmgw.agent import state as engine_state
from llmgw.agent.client import AgentClient
from llmgw.agent.supervisor import Supervisor
from llmgw.catalog import Catalog
from llmgw.config import AgentConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.engine_checks import EngineChecks
from llmgw.control.inventory import READY, UNREACHABLE, Inventory, Replica
from llmgw.control.reconciler import Reconciler
from llmgw.control.stream.service import serve_agents
from llmgw.engines.registry import ENGINES

WAIT_S = 60.0
MODEL = "sim-chat"


def _catalog(cfg: ServerConfig, **control: float) -> ServerConfig:
    return config.evolve(
        cfg,
        models=[ModelConfig(name=MODEL, replicas=1, profiles=[ProfileConfig(engine="sim")])],
        # Nothing to install: the sim ships inside llmgw.
        engines={"llamacpp": ""},
        control=config.evolve(cfg.control, **control),
    )


@contextlib.asynccontextmanager
async def control_plane(cfg: ServerConfig) -> AsyncIterator[tuple[Inventory, int]]:
    inventory = Inventory(grace_s=cfg.control.grace_s)
    async with serve_agents(cfg, inventory) as port, asyncio.TaskGroup() as tasks:
        reconciler = tasks.create_task(Reconciler(cfg, inventory, Catalog(cfg), in_flight={}).run())
        # As the server role: the engines of a node whose agent is lost serve while they answer.
        checks = tasks.create_task(EngineChecks(inventory, cfg.control.engine_check_s).run())
        try:
            yield inventory, port
        finally:
            reconciler.cancel()
            checks.cancel()


@contextlib.asynccontextmanager
async def in_process_agent(cfg: AgentConfig) -> AsyncIterator[Supervisor]:
    async with (
        Supervisor(ENGINES, ready_timeout_s=WAIT_S, state_dir=Path(cfg.state_dir)) as supervisor,
        asyncio.TaskGroup() as tasks,
    ):
        client = AgentClient(cfg, supervisor, {"sim": "builtin"}, backoff_base_s=0.05, backoff_max_s=0.2)
        task = tasks.create_task(client.run())
        try:
            yield supervisor
        finally:
            task.cancel()


def _agent_cfg(fleet, node: str, port: int, state_dir: Path) -> AgentConfig:
    return AgentConfig(
        node_id=node,
        servers=[f"127.0.0.1:{port}"],
        state_dir=str(state_dir),
        tls=fleet.agents[node],
        heartbeat_interval_s=0.1,
    )


def _one_ready(inventory: Inventory) -> Replica | None:
    replicas = inventory.replicas(MODEL)
    return replicas[0] if len(replicas) == 1 and replicas[0].state == READY else None


async def _settle(inventory: Inventory, cfg: ServerConfig, passes: int = 5) -> None:
    """Let the reconciler run a few passes (each waits at most control.interval_s)."""
    for _ in range(passes):
        inventory.changed.set()
        await asyncio.sleep(cfg.control.interval_s)


async def _chat(endpoint: str, secret: str) -> int:
    """A chat completion straight to an engine, presenting secret as the gateway does."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "still there?"}]}
    headers = {"Authorization": f"Bearer {secret}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(endpoint + "/v1/chat/completions", json=body, headers=headers) as reply,
    ):
        return reply.status


def _routed_secret(inventory: Inventory, replica: Replica) -> str:
    """The secret the gateway would present to replica's engine (empty when it is not routed)."""
    route = inventory.route(replica.endpoint)
    return route.secret if route is not None else ""


async def _agent_process(
    config_path: Path, stderr: int = asyncio.subprocess.DEVNULL
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        "--role=agent",
        "--config",
        str(config_path),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=stderr,
    )


async def test_an_agent_killed_while_its_engine_serves_leaves_it_serving_and_no_second_replica_appears(
    fleet, server_cfg, tmp_path: Path, eventually
) -> None:
    cfg = _catalog(server_cfg)
    state_dir = tmp_path / "state"
    agents: list[asyncio.subprocess.Process] = []
    try:
        async with control_plane(cfg) as (inventory, port):
            path = tmp_path / "agent.yaml"
            text = await asyncio.to_thread(config.dump, _agent_cfg(fleet, "n1", port, state_dir))
            await asyncio.to_thread(path.write_text, text)
            agents.append(await _agent_process(path))
            await eventually(lambda: _one_ready(inventory), WAIT_S)
            before = _one_ready(inventory)
            assert before is not None
            secret = _routed_secret(inventory, before)
            assert secret
            assert await _chat(before.endpoint, "not-the-secret") == 401

            agents[0].send_signal(signal.SIGKILL)
            await agents[0].wait()
            assert await _chat(before.endpoint, secret) == 200, (
                "the engine must keep serving while no agent runs"
            )
            await eventually(lambda: not inventory.node("n1").connected, WAIT_S)  # type: ignore[union-attr]

            agents.append(await _agent_process(path))
            await eventually(lambda: inventory.node("n1").connected, WAIT_S)  # type: ignore[union-attr]
            await eventually(lambda: _one_ready(inventory), WAIT_S)
            after = _one_ready(inventory)
            assert after is not None
            assert (after.shard_id, after.endpoint) == (before.shard_id, before.endpoint)
            await _settle(inventory, cfg)
            assert [r.shard_id for r in inventory.replicas(MODEL)] == [before.shard_id]
            # The new agent read the secret back from its state file and reported it again.
            assert _routed_secret(inventory, after) == secret
            assert await _chat(after.endpoint, secret) == 200
    finally:
        for agent in agents:
            if agent.returncode is None:
                agent.send_signal(signal.SIGKILL)
                await agent.wait()
        # Engines kept on stop outlive the test's agents: the state file says which to end.
        for record in await asyncio.to_thread(engine_state.read_state, state_dir):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)


async def test_a_second_signal_kills_every_engine_even_of_an_agent_that_keeps_them_on_stop(
    fleet, server_cfg, tmp_path: Path, eventually
) -> None:
    """keep_engines_on_stop is for a clean stop; a forced one (exit 130) leaves no engine behind."""
    cfg = config.evolve(
        _catalog(server_cfg),
        models=[
            ModelConfig(name=name, replicas=1, profiles=[ProfileConfig(engine="sim")])
            for name in (MODEL, "sim-other")
        ],
    )
    state_dir = tmp_path / "state"
    assert AgentConfig().keep_engines_on_stop, "the default this test relies on"
    agent: asyncio.subprocess.Process | None = None
    try:
        async with control_plane(cfg) as (inventory, port):
            path = tmp_path / "agent.yaml"
            text = await asyncio.to_thread(config.dump, _agent_cfg(fleet, "n1", port, state_dir))
            await asyncio.to_thread(path.write_text, text)
            agent = await _agent_process(path, stderr=asyncio.subprocess.PIPE)

            def both_ready() -> bool:
                return all(
                    [r.state for r in inventory.replicas(model)] == [READY] for model in (MODEL, "sim-other")
                )

            await eventually(both_ready, WAIT_S)
            engines = [r.pid for r in await asyncio.to_thread(engine_state.read_state, state_dir)]
            assert len(engines) == 2
            # Both signals reach the agent before it runs again, so the second one surely comes
            # while the first one's drain is under way (a drain that keeps engines is quick).
            # SIGINT for the second: two SIGTERMs pending at once are delivered as one.
            agent.send_signal(signal.SIGSTOP)
            agent.send_signal(signal.SIGTERM)
            agent.send_signal(signal.SIGINT)
            agent.send_signal(signal.SIGCONT)
            assert agent.stderr is not None
            output = (await asyncio.wait_for(agent.stderr.read(), WAIT_S)).decode()
            assert await agent.wait() == 130, output
            assert "killing engines now" in output
            await eventually(lambda: not any(_engine_alive(pid) for pid in engines), WAIT_S)
    finally:
        if agent is not None and agent.returncode is None:
            agent.send_signal(signal.SIGKILL)
            await agent.wait()
        for record in await asyncio.to_thread(engine_state.read_state, state_dir):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)


def _engine_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_replicas_are_adopted_by_a_restarted_server_and_never_duplicated(
    fleet, server_cfg, tmp_path: Path, eventually
) -> None:
    cfg = _catalog(server_cfg)
    async with contextlib.AsyncExitStack() as agent_side:
        first = control_plane(cfg)
        inventory, port = await first.__aenter__()
        try:
            supervisor = await agent_side.enter_async_context(
                in_process_agent(_agent_cfg(fleet, "n1", port, tmp_path))
            )
            await eventually(lambda: _one_ready(inventory), WAIT_S)
            before = _one_ready(inventory)
            assert before is not None
            secret = _routed_secret(inventory, before)
            assert secret
        finally:
            await first.__aexit__(None, None, None)

        # The server comes back on the same address, knowing nothing but what the node tells it.
        again = config.evolve(cfg, agent_listen=f"127.0.0.1:{port}")
        async with control_plane(again) as (inventory, _):
            await eventually(lambda: _one_ready(inventory), WAIT_S)
            after = _one_ready(inventory)
            assert after is not None
            assert (after.shard_id, after.endpoint) == (before.shard_id, before.endpoint)
            await _settle(inventory, cfg)
            assert [r.shard_id for r in inventory.replicas(MODEL)] == [before.shard_id]
            assert [s.shard_id for s in supervisor.statuses()] == [before.shard_id]
            # The restarted server knew no secret: the node's Register brought it back.
            assert _routed_secret(inventory, after) == secret
            assert await _chat(after.endpoint, secret) == 200


async def test_a_lost_node_has_its_replica_replaced_on_another(
    fleet, server_cfg, tmp_path: Path, eventually
) -> None:
    cfg = _catalog(server_cfg, grace_s=1.0, engine_check_s=0.1)
    async with control_plane(cfg) as (inventory, port), contextlib.AsyncExitStack() as n1:
        await n1.enter_async_context(in_process_agent(_agent_cfg(fleet, "n1", port, tmp_path / "n1")))
        await eventually(lambda: _one_ready(inventory), WAIT_S)
        # Only now the second node: the replica is on n1, and n2 is where it can go.
        async with in_process_agent(_agent_cfg(fleet, "n2", port, tmp_path / "n2")) as second:
            await eventually(lambda: (n := inventory.node("n2")) is not None and n.connected, WAIT_S)
            assert [r.node_id for r in inventory.replicas(MODEL)] == ["n1"]

            # n1 is lost: its stream and its heartbeats stop, without a word to the server.
            await n1.aclose()
            await eventually(lambda: inventory.node("n1").state == UNREACHABLE, WAIT_S)  # type: ignore[union-attr]
            await eventually(
                lambda: any(r.node_id == "n2" and r.state == READY for r in inventory.replicas(MODEL)), WAIT_S
            )
            assert len(second.statuses()) == 1
            # n1's engine went with its agent: the gateway's check takes it out.
            await eventually(
                lambda: inventory.ready_endpoints(MODEL) == (second.statuses()[0].endpoint,), WAIT_S
            )


async def test_what_a_node_reports_of_itself_reaches_the_inventory_and_so_does_a_gpu_failing(
    fleet, server_cfg, tmp_path: Path, eventually
) -> None:
    """GPU class and health from a fake NVML, fabrics, storage and labels: at Register, then on change."""
    import importlib.util

    from llmgw.agent.discovery.gpus import GpuDiscovery
    from llmgw.agent.discovery.node import NodeReport

    spec = importlib.util.spec_from_file_location(
        "fake_nvml", Path(__file__).parents[1] / "agent" / "discovery" / "fake_nvml.py"
    )
    assert spec is not None and spec.loader is not None
    fake_nvml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake_nvml)
    nvml = fake_nvml.FakeNvml([fake_nvml.FakeCard(uuid="GPU-a"), fake_nvml.FakeCard(uuid="GPU-b")])
    ib = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    await asyncio.to_thread(ib.mkdir, parents=True)
    await asyncio.to_thread((ib / "state").write_text, "4: ACTIVE\n")

    cfg = _catalog(server_cfg)
    async with control_plane(cfg) as (inventory, port):
        agent_cfg = config.evolve(
            _agent_cfg(fleet, "n1", port, tmp_path / "state"), fabric="ib-east", labels={"rack": "r1"}
        )
        report = NodeReport(agent_cfg, gpus=GpuDiscovery(nvml), infiniband=tmp_path / "ib")
        await report.refresh()
        async with (
            Supervisor(ENGINES, ready_timeout_s=WAIT_S, state_dir=Path(agent_cfg.state_dir)) as supervisor,
            asyncio.TaskGroup() as tasks,
        ):
            client = AgentClient(agent_cfg, supervisor, {"sim": "builtin"}, report=report)
            running = [tasks.create_task(client.run()), tasks.create_task(report.run(0.05))]
            try:
                await eventually(lambda: inventory.node("n1") is not None, WAIT_S)
                node = inventory.node("n1")
                assert node is not None
                assert [g.gpu_class for g in node.gpus] == ["h100-80g", "h100-80g"]
                assert node.fabric_names() == {"ib-east"}
                assert node.labels == {"rack": "r1"}
                assert node.storage and node.storage[0].free_bytes > 0
                assert node.memory is not None and node.memory.total_mb > 0

                nvml.xid(1, 48)
                await eventually(lambda: len(node.healthy_gpus()) == 1, WAIT_S)
                assert node.gpus[1].unhealthy_reason == "XID 48: a double-bit ECC error"
            finally:
                for task in running:
                    task.cancel()
