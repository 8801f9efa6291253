"""The agent role: the supervisor of engine processes and the stream to the control plane."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import attrs
import structlog

from llmgw.agent.client import AgentClient
from llmgw.agent.supervisor import Supervisor
from llmgw.config import AgentConfig
from llmgw.engines.registry import ENGINES

log = structlog.get_logger(__name__)


@attrs.define
class AgentHandle:
    client: AgentClient
    supervisor: Supervisor

    def kill_engines(self) -> None:
        """Kill every engine's process group now; for a forced exit."""
        self.supervisor.kill_all()


@contextlib.asynccontextmanager
async def agent_role(cfg: AgentConfig) -> AsyncIterator[AgentHandle]:
    async with contextlib.AsyncExitStack() as stack:
        supervisor = Supervisor(ENGINES, ready_timeout_s=cfg.ready_timeout_s)
        await stack.enter_async_context(supervisor)
        client = AgentClient(cfg, supervisor, engine_versions={"sim": "builtin"})
        tasks = await stack.enter_async_context(asyncio.TaskGroup())
        task = tasks.create_task(client.run(), name="agent-stream")
        stack.callback(task.cancel)
        log.info("agent started", node=cfg.node_id, servers=cfg.servers)
        yield AgentHandle(client=client, supervisor=supervisor)
        log.info("agent stopping")
