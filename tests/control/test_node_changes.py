"""A node's hardware changing after it registered: the inventory follows, and so does placement.

Register carries everything (tests/control/test_adoption.py); here, what a
heartbeat says later: a fabric whose HCA went down, a GPU that stopped
answering, a filesystem filling up, memory in use.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

from llmgw.agent.client import AgentClient
from llmgw.agent.discovery.gpus import GpuDiscovery
from llmgw.agent.discovery.node import NodeReport
from llmgw.agent.supervisor import Supervisor
from llmgw.config import AgentConfig, ModelConfig, ProfileConfig, ServerConfig
from llmgw.control.inventory import Inventory
from llmgw.control.placement import explain
from llmgw.control.stream.service import serve_agents
from llmgw.engines.registry import ENGINES
from llmgw.proto.llmgw import v1 as pb

WAIT_S = 30.0

_spec = importlib.util.spec_from_file_location(
    "fake_nvml_for_changes", Path(__file__).parents[1] / "agent" / "discovery" / "fake_nvml.py"
)
assert _spec is not None and _spec.loader is not None
fake_nvml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_nvml)

TWO_NODE = ModelConfig(
    name="big",
    profiles=[ProfileConfig(name="ib", engine="sim", gpu_class="h100-80g", gpus_per_node=2, nodes=2)],
)
TWO_CARDS = ModelConfig(
    name="pair", profiles=[ProfileConfig(name="pair", engine="sim", gpu_class="h100-80g", gpus_per_node=2)]
)


class TestHeartbeatFlags:
    def _node(self) -> Inventory:
        inventory = Inventory(grace_s=10)
        inventory.attach(
            pb.Register(
                node_id="n1",
                fabrics=[pb.Fabric(name="ib-east", hcas=["mlx5_0"])],
                storage=[pb.Storage(path="/var/lib/llmgw", total_bytes=10**12, free_bytes=5 * 10**11)],
                memory=pb.Memory(total_mb=65536, available_mb=60000),
            )
        )
        return inventory

    def test_lists_a_heartbeat_does_not_flag_are_left_as_they_were(self) -> None:
        inventory = self._node()
        inventory.heartbeat("n1", pb.Heartbeat())
        node = inventory.node("n1")
        assert node is not None
        assert node.fabric_names() == {"ib-east"}
        assert [s.free_bytes for s in node.storage] == [5 * 10**11]

    def test_a_flagged_empty_list_means_none_left(self) -> None:
        inventory = self._node()
        inventory.changed.clear()
        inventory.heartbeat("n1", pb.Heartbeat(fabrics_changed=True, fabrics=[]))
        node = inventory.node("n1")
        assert node is not None and node.fabrics == []
        # Placement has something to reconsider: a multi-node replica may no longer fit there.
        assert inventory.changed.is_set()

    def test_storage_and_memory_follow_the_heartbeat(self) -> None:
        inventory = self._node()
        inventory.heartbeat(
            "n1",
            pb.Heartbeat(
                storage_changed=True,
                storage=[pb.Storage(path="/var/lib/llmgw", total_bytes=10**12, free_bytes=10**9)],
                memory=pb.Memory(total_mb=65536, available_mb=1000),
            ),
        )
        node = inventory.node("n1")
        assert node is not None and node.memory is not None
        assert [s.free_bytes for s in node.storage] == [10**9]
        assert node.memory.available_mb == 1000


async def _write(path: Path, text: str) -> None:
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(path.write_text, text)


async def test_a_fabric_going_down_and_a_gpu_failing_reach_placement_over_the_real_stream(
    fleet, server_cfg: ServerConfig, tmp_path: Path, eventually
) -> None:
    """Two nodes on ib-east take a 2-node replica until n2's HCA goes down; a lost card counts as not free."""
    nvml = {
        n: fake_nvml.FakeNvml([fake_nvml.FakeCard(uuid=f"{n}-a"), fake_nvml.FakeCard(uuid=f"{n}-b")])
        for n in ("n1", "n2")
    }
    port_state = {n: tmp_path / n / "ib" / "mlx5_0" / "ports" / "1" / "state" for n in ("n1", "n2")}
    for path in port_state.values():
        await _write(path, "4: ACTIVE\n")
    inventory = Inventory(grace_s=server_cfg.control.grace_s)
    async with serve_agents(server_cfg, inventory) as port, asyncio.TaskGroup() as tasks:
        running = []
        async with Supervisor(ENGINES, ready_timeout_s=WAIT_S, state_dir=tmp_path / "agent") as supervisor:
            for n in ("n1", "n2"):
                agent_cfg = AgentConfig(
                    node_id=n,
                    servers=[f"127.0.0.1:{port}"],
                    state_dir=str(tmp_path / n / "state"),
                    tls=fleet.agents[n],
                    heartbeat_interval_s=0.05,
                    fabric="ib-east",
                )
                report = NodeReport(agent_cfg, gpus=GpuDiscovery(nvml[n]), infiniband=tmp_path / n / "ib")
                await report.refresh()
                client = AgentClient(agent_cfg, supervisor, {"sim": "builtin"}, report=report)
                running += [tasks.create_task(client.run()), tasks.create_task(report.run(0.05))]
            try:
                await eventually(lambda: len(inventory.nodes()) == 2, WAIT_S)
                verdicts = explain(TWO_NODE, inventory.nodes(), [])
                assert [v.candidate for v in verdicts] == [True, True]

                await _write(port_state["n2"], "1: DOWN\n")
                await eventually(lambda: not inventory.node("n2").fabrics, WAIT_S)  # type: ignore[union-attr]
                by_node = {v.node: v.reason for v in explain(TWO_NODE, inventory.nodes(), [])}
                assert by_node["n2"] == "has no fabric, which a 2-node profile needs"
                assert by_node["n1"].startswith("is on no fabric with the 2 candidate nodes")

                nvml["n1"].cards[1].lost = True
                await eventually(lambda: len(inventory.node("n1").healthy_gpus()) == 1, WAIT_S)  # type: ignore[union-attr]
                by_node = {v.node: v.reason for v in explain(TWO_CARDS, inventory.nodes(), [])}
                assert by_node["n1"].startswith(
                    "has too few free h100-80g GPUs (1 of 2 free, 2 needed); "
                    "1 unhealthy (GPU 1: stopped answering NVML"
                )
                assert by_node["n2"] == ""
            finally:
                for task in running:
                    task.cancel()
