"""The node's report: everything in Register, and in a Heartbeat only what changed since."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from llmgw.agent.discovery.gpus import GpuDiscovery
from llmgw.agent.discovery.node import NodeReport
from llmgw.config import AgentConfig
from llmgw.proto.llmgw import v1 as pb

_spec = importlib.util.spec_from_file_location("fake_nvml", Path(__file__).with_name("fake_nvml.py"))
assert _spec is not None and _spec.loader is not None
fake_nvml = importlib.util.module_from_spec(_spec)
sys.modules["fake_nvml"] = fake_nvml
_spec.loader.exec_module(fake_nvml)


def _report(tmp_path: Path, nvml: object, weights: list[pb.Weights]) -> NodeReport:
    (tmp_path / "ib" / "mlx5_0" / "ports" / "1").mkdir(parents=True)
    (tmp_path / "ib" / "mlx5_0" / "ports" / "1" / "state").write_text("4: ACTIVE\n")
    cfg = AgentConfig(
        node_id="n1", state_dir=str(tmp_path / "state"), fabric="ib-east", labels={"rack": "r1"}
    )
    return NodeReport(cfg, gpus=GpuDiscovery(nvml), weights=lambda: list(weights), infiniband=tmp_path / "ib")  # type: ignore[arg-type]


async def test_register_carries_gpus_memory_fabrics_storage_labels_and_weights(tmp_path: Path) -> None:
    weights = [pb.Weights(source="http://m/a.gguf", path="/w/a.gguf", size_bytes=10)]
    report = _report(tmp_path, fake_nvml.FakeNvml(), weights)
    await report.refresh()
    register = report.fill_register(pb.Register(node_id="n1"))
    assert [(g.gpu_class, g.healthy) for g in register.gpus] == [("h100-80g", True)]
    assert register.memory.total_mb > 0
    assert [(f.name, f.hcas) for f in register.fabrics] == [("ib-east", ["mlx5_0"])]
    assert [s.path for s in register.storage] == [str(tmp_path / "state" / "weights")]
    assert register.labels == {"rack": "r1"}
    assert register.weights == weights


async def test_a_heartbeat_carries_only_what_changed_since_register(tmp_path: Path) -> None:
    nvml = fake_nvml.FakeNvml()
    weights: list[pb.Weights] = []
    report = _report(tmp_path, nvml, weights)
    await report.refresh()
    report.fill_register(pb.Register())
    quiet = report.fill_heartbeat(pb.Heartbeat())
    assert quiet.memory.total_mb > 0
    assert not (quiet.gpus_changed or quiet.fabrics_changed or quiet.storage_changed or quiet.weights_changed)

    nvml.xid(0, 79)
    weights.append(pb.Weights(source="http://m/a.gguf"))
    await report.refresh()
    beat = report.fill_heartbeat(pb.Heartbeat())
    assert beat.gpus_changed and beat.gpus[0].unhealthy_reason == "XID 79: the GPU has fallen off the bus"
    assert beat.weights_changed and [w.source for w in beat.weights] == ["http://m/a.gguf"]
    assert not beat.fabrics_changed

    weights.clear()
    gone = report.fill_heartbeat(pb.Heartbeat())
    # An empty list with its flag: the weights are gone, not unmentioned.
    assert gone.weights_changed and gone.weights == []
    assert not gone.gpus_changed


async def test_gpu_memory_moving_a_little_is_not_worth_a_heartbeat(tmp_path: Path) -> None:
    card = fake_nvml.FakeCard(used=1000 * 2**20)
    report = _report(tmp_path, fake_nvml.FakeNvml([card]), [])
    await report.refresh()
    report.fill_register(pb.Register())
    card.used += 10 * 2**20
    await report.refresh()
    assert not report.fill_heartbeat(pb.Heartbeat()).gpus_changed
    card.used += 4000 * 2**20
    await report.refresh()
    assert report.fill_heartbeat(pb.Heartbeat()).gpus_changed
