"""A replica whose engine crashes is retried on its node only after control.base_backoff_s, for real.

The server's agent service and inventory, the reconciler on a clock the test
moves, and a real agent running the sim engine as a process, over mutual TLS
on loopback.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from llmgw.catalog import Catalog
from llmgw.config import ControlConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.reconciler import Reconciler
from tests.agent.test_client_node_changes import GB, Certs, FakeDisk, certs, connected_agent  # noqa: F401
from tests.waiting import eventually

SIM = ModelConfig(name="sim-chat", replicas=1, profiles=[ProfileConfig(engine="sim")])
# Earlier in the catalog and placeable nowhere (no node has vLLM): every pass tries it first.
NOWHERE = ModelConfig(name="big", replicas=1, profiles=[ProfileConfig(engine="vllm")])


class CountingReconciler(Reconciler):
    passes = 0

    async def reconcile(self) -> None:
        await super().reconcile()
        self.passes += 1


async def test_a_crashed_engine_is_not_started_again_on_its_node_before_the_backoff(
    certs: Certs,  # noqa: F811
    tmp_path: Path,
) -> None:
    """With a model placeable nowhere earlier in the catalog, whose try came first in every pass."""
    now = [1000.0]
    cfg = ServerConfig(models=[NOWHERE, SIM], control=ControlConfig(interval_s=0.02, base_backoff_s=5.0))
    async with connected_agent(certs, tmp_path, FakeDisk(50 * GB)) as agent:
        inventory = agent.inventory
        reconciler = CountingReconciler(cfg, inventory, Catalog(cfg), in_flight={}, clock=lambda: now[0])
        async with asyncio.TaskGroup() as tasks:
            run = tasks.create_task(reconciler.run())
            await eventually(lambda: inventory.ready_endpoints("sim-chat"), within_s=30)
            (first,) = inventory.replicas("sim-chat")
            (running,) = agent.supervisor.statuses()
            os.kill(running.pid, signal.SIGKILL)
            await eventually(lambda: "backing off" in inventory.why_no_ready("sim-chat"), within_s=30)
            # Many passes later, with the clock short of the wait by a hair, nothing runs there: neither
            # the control plane nor the agent started it again.
            now[0] += 4.9
            passes = reconciler.passes
            await eventually(lambda: reconciler.passes >= passes + 20, within_s=30)
            assert inventory.replicas("sim-chat") == []
            assert inventory.why_no_ready("sim-chat").endswith(
                "(node n1 is backing off after 1 failure (next try in 0 s): "
                "sim was killed by SIGKILL after serving)"
            )
            now[0] += 0.1
            await eventually(lambda: inventory.ready_endpoints("sim-chat"), within_s=30)
            (second,) = inventory.replicas("sim-chat")
            assert second.shard_id != first.shard_id and second.node_id == "n1"
            run.cancel()
