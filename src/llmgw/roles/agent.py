"""The agent role: the supervisor of engine processes and the stream to the control plane."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import attrs
import structlog

import llmgw
from llmgw.addresses import parse_port_range
from llmgw.agent import trial
from llmgw.agent.client import AgentClient
from llmgw.agent.discovery.host import discover_host
from llmgw.agent.discovery.node import NodeReport
from llmgw.agent.metrics import AgentMetrics
from llmgw.agent.provision.loop import ProvisionLoop
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import SubprocessRunner
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.upgrade import Upgrader
from llmgw.agent.weights import WeightsCache
from llmgw.config import AgentConfig
from llmgw.engines.registry import ENGINES
from llmgw.metrics import Metrics, new_registry, serve_metrics
from llmgw.pki import client_ssl_context

log = structlog.get_logger(__name__)


@attrs.define
class AgentHandle:
    client: AgentClient
    supervisor: Supervisor
    # Set when the agent has decided to restart into another environment (an upgrade, or back).
    upgrader: Upgrader
    # metrics_listen's URL; "" when it is not set.
    metrics_url: str = attrs.field(default="", kw_only=True)

    def kill_engines(self) -> None:
        """Kill every engine's process group now, for a forced exit.

        Whatever keep_engines_on_stop says: that setting is for an agent that stops cleanly and
        leaves its engines to the next one. A person who sends a second signal wants everything
        gone now, and an engine left behind there held its GPU and port with no agent to say so.
        """
        self.supervisor.kill_all()
        self.supervisor.forget_engines()


@contextlib.asynccontextmanager
async def agent_role(cfg: AgentConfig) -> AsyncIterator[AgentHandle]:
    # Read before anything starts, as the server reads its own before it listens: read first by the
    # stream's task, a key this user may not read ended the agent in a CancelledError naming no file,
    # after it had adopted the engines the last one left. The stream builds its context again.
    await asyncio.to_thread(client_ssl_context, cfg.tls)
    async with contextlib.AsyncExitStack() as stack:
        host = await discover_host()
        releases = await stack.enter_async_context(
            ReleaseClient(cfg.provision.api_url, cfg.provision.download_url)
        )
        provision = ProvisionLoop(cfg, host, SubprocessRunner(), releases)
        # Before the first Register, so it says which engines agent.yaml names instead of "not probed".
        await provision.probe_configured()
        # A download that fills the disk has the node's free space read and sent at once.
        disk_changed = asyncio.Event()
        weights = await stack.enter_async_context(
            WeightsCache(cfg.weights_dir, on_disk_full=disk_changed.set)
        )
        supervisor = Supervisor(
            ENGINES,
            ready_timeout_s=cfg.ready_timeout_s,
            binaries=lambda engine: _binary_for(cfg, provision.binaries(), engine),
            parallel=lambda engine: _parallel_for(cfg, engine),
            weights=weights,
            state_dir=Path(cfg.state_dir),
            keep_on_close=cfg.keep_engines_on_stop,
            # Where engines listen, and on which ports; the address they are advertised at is the
            # client's to find once connected (agent/client.py), unless agent.yaml names it.
            host=cfg.advertise_address or "127.0.0.1",
            bind=cfg.engine_bind,
            ports=parse_port_range(cfg.engine_ports),
            probe=cfg.probe,
            node=cfg.node_id,
        )
        await stack.enter_async_context(supervisor)
        # Before the first Register, so it lists the engines the previous agent left running.
        await supervisor.adopt()
        report = NodeReport(
            cfg, weights=lambda: weights.present(supervisor.weights_in_use()), disk_changed=disk_changed
        )
        await report.refresh()
        # The last upgrade, and whether this agent is the new one on trial (agent/trial.py).
        marker, on_trial = await asyncio.to_thread(trial.settle, Path(cfg.state_dir), llmgw.__version__)
        upgrader = Upgrader(
            Path(cfg.state_dir), marker, on_trial=on_trial, leave_engines=supervisor.leave_engines_on_close
        )
        client = AgentClient(
            cfg,
            supervisor,
            # The sim ships inside llmgw: never installed, never missing.
            engine_versions={} if cfg.engine_options("sim").disabled else {"sim": "builtin"},
            provision=provision,
            host=host.to_proto(),
            warnings=host.warnings(),
            report=report,
            upgrades=upgrader,
        )
        agent_metrics = AgentMetrics(
            new_registry(),
            cfg.node_id,
            engines=supervisor.statuses,
            restarts=lambda: dict(supervisor.restarts),
            installs=provision.statuses,
            downloaded=lambda: weights.downloaded_bytes,
            gpus=lambda: report.gpus,
            gpu_readings=lambda: report.gpu_readings,
            targets=supervisor.metrics_targets,
        )
        metrics = Metrics(
            agent_metrics.registry,
            [agent_metrics.state, agent_metrics.engine_pages],
            [agent_metrics.refresh],
        )
        metrics_url = await stack.enter_async_context(
            serve_metrics(metrics, cfg.metrics_listen, "metrics_listen")
        )
        tasks = await stack.enter_async_context(asyncio.TaskGroup())
        owned = [
            tasks.create_task(provision.run(), name="agent-provision"),
            tasks.create_task(client.run(), name="agent-stream"),
            tasks.create_task(report.run(cfg.heartbeat_interval_s), name="agent-discovery"),
            tasks.create_task(upgrader.run(client.connected), name="agent-upgrade"),
        ]
        for task in owned:
            stack.callback(task.cancel)
        log.info("agent started", node=cfg.node_id, servers=cfg.servers, metrics=metrics_url)
        yield AgentHandle(client=client, supervisor=supervisor, upgrader=upgrader, metrics_url=metrics_url)
        log.info("agent stopping")


def _binary_for(cfg: AgentConfig, installed: Mapping[str, str], engine: str) -> str:
    """The executable for engine: the one installed, or the one agent.yaml names (then none is installed)."""
    if installed.get(engine):
        return installed[engine]
    return cfg.engine_options(engine).binary


def _parallel_for(cfg: AgentConfig, engine: str) -> int:
    """agent.yaml's engines.<engine>.parallel, or its default."""
    return cfg.engine_options(engine).parallel
