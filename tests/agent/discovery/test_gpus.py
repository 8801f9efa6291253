"""GPU discovery through a fake NVML: the class of a card, its memory in use, and why it is unhealthy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from llmgw.agent.discovery.gpus import GpuDiscovery, GpuReading, gpu_class

_spec = importlib.util.spec_from_file_location("fake_nvml", Path(__file__).with_name("fake_nvml.py"))
assert _spec is not None and _spec.loader is not None
fake_nvml = importlib.util.module_from_spec(_spec)
sys.modules["fake_nvml"] = fake_nvml
_spec.loader.exec_module(fake_nvml)
FakeCard, FakeNvml = fake_nvml.FakeCard, fake_nvml.FakeNvml

MIB = 2**20


class TestGpuClass:
    @pytest.mark.parametrize(
        ("name", "mib", "expected"),
        [
            ("NVIDIA H100 80GB HBM3", 81559, "h100-80g"),
            ("NVIDIA H200", 143771, "h200-141g"),
            ("NVIDIA A100-SXM4-40GB", 40960, "a100-40g"),
            ("NVIDIA A100 80GB PCIe", 81920, "a100-80g"),
            ("NVIDIA H100 NVL", 95830, "h100-94g"),
            ("NVIDIA L4", 23034, "l4-24g"),
            ("Tesla T4", 15360, "t4-16g"),
            ("NVIDIA GeForce RTX 4090", 24564, "rtx4090-24g"),
            ("NVIDIA RTX A6000", 49140, "rtxa6000-48g"),
            ("Tesla V100-SXM2-16GB", 16384, "v100-16g"),
        ],
    )
    def test_a_card_is_named_by_its_model_and_its_marketed_memory(
        self, name: str, mib: int, expected: str
    ) -> None:
        assert gpu_class(name, mib * MIB) == expected

    def test_a_size_nobody_sells_is_given_as_it_is(self) -> None:
        """A MIG slice of 10 GiB is not rounded to a card size it is not."""
        assert gpu_class("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984 * MIB).endswith("-10g")


class TestDiscovery:
    async def test_a_healthy_card_is_reported_with_its_class_and_memory_in_use(self) -> None:
        nvml = FakeNvml([FakeCard(used=2048 * MIB)])
        (gpu,) = await GpuDiscovery(nvml).scan()
        assert (gpu.index, gpu.uuid, gpu.gpu_class) == (0, "GPU-0", "h100-80g")
        assert (gpu.memory_total_mb, gpu.memory_used_mb) == (81559, 2048)
        assert gpu.healthy and not gpu.unhealthy_reason

    async def test_utilisation_and_temperature_are_read_for_the_metrics_page(self) -> None:
        nvml = FakeNvml(
            [FakeCard(utilization=87, temperature=71), FakeCard(uuid="GPU-1", utilization_supported=False)]
        )
        discovery = GpuDiscovery(nvml)
        await discovery.scan()
        assert discovery.readings == {
            0: GpuReading(utilization_percent=87.0, temperature_celsius=71.0),
            # A card without a utilisation counter still gives its temperature.
            1: GpuReading(utilization_percent=None, temperature_celsius=40.0),
        }

    async def test_a_node_without_a_driver_reports_no_gpu(self) -> None:
        assert await GpuDiscovery(FakeNvml(driver=False)).scan() == []

    async def test_an_xid_error_makes_the_card_unhealthy_until_the_agent_restarts(self) -> None:
        nvml = FakeNvml([FakeCard(uuid="GPU-a"), FakeCard(uuid="GPU-b")])
        discovery = GpuDiscovery(nvml)
        await discovery.scan()
        nvml.xid(1, 79)
        first = await discovery.scan()
        assert [g.healthy for g in first] == [True, False]
        assert first[1].unhealthy_reason == "XID 79: the GPU has fallen off the bus"
        # The event is delivered once; the card stays out of placement anyway.
        assert not (await discovery.scan())[1].healthy

    async def test_an_xid_a_program_causes_leaves_the_card_healthy(self) -> None:
        nvml = FakeNvml()
        discovery = GpuDiscovery(nvml)
        await discovery.scan()
        nvml.xid(0, 13)
        assert (await discovery.scan())[0].healthy

    async def test_uncorrected_ecc_errors_make_the_card_unhealthy(self) -> None:
        (gpu,) = await GpuDiscovery(FakeNvml([FakeCard(uncorrected_ecc=3)])).scan()
        assert not gpu.healthy
        assert gpu.unhealthy_reason == "3 uncorrected ECC errors since the driver loaded"

    async def test_retired_pages_waiting_for_a_reset_make_the_card_unhealthy(self) -> None:
        (gpu,) = await GpuDiscovery(FakeNvml([FakeCard(pages_pending=1)])).scan()
        assert gpu.unhealthy_reason == "retired memory pages are waiting for the GPU to be reset"

    async def test_a_card_without_ecc_is_not_unhealthy_for_it(self) -> None:
        (gpu,) = await GpuDiscovery(
            FakeNvml([FakeCard(name="NVIDIA GeForce RTX 4090", ecc_supported=False)])
        ).scan()
        assert gpu.healthy

    async def test_a_card_that_stopped_answering_is_unhealthy_and_keeps_what_was_known(self) -> None:
        card = FakeCard()
        nvml = FakeNvml([card])
        discovery = GpuDiscovery(nvml)
        await discovery.scan()
        card.lost = True
        (gpu,) = await discovery.scan()
        assert not gpu.healthy
        assert gpu.unhealthy_reason.startswith("stopped answering NVML")
        assert gpu.gpu_class == "h100-80g"

    async def test_nvml_that_hangs_marks_every_card_unhealthy_without_blocking_the_loop(self) -> None:
        nvml = FakeNvml([FakeCard(), FakeCard(uuid="GPU-1")])
        discovery = GpuDiscovery(nvml, scan_timeout_s=0.05)
        await discovery.scan()
        nvml.hang.set()
        try:
            gpus = await discovery.scan()
            assert [g.healthy for g in gpus] == [False, False]
            assert "no answer within" in gpus[0].unhealthy_reason
            # The hung read is not joined by a second one.
            assert not (await discovery.scan())[0].healthy
        finally:
            nvml.hang.clear()
            nvml.release.set()
        # Once NVML answers again, so does the scan.
        discovery_answers = await GpuDiscovery(nvml).scan()
        assert all(g.healthy for g in discovery_answers)
