"""A fake of the pynvml functions discovery calls: cards this machine does not have, failing on cue."""

from __future__ import annotations

import threading
from typing import Any

import attrs
import pynvml


@attrs.define
class FakeCard:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-0"
    total: int = 81559 * 2**20
    used: int = 0
    uncorrected_ecc: int = 0
    pages_pending: int = 0
    lost: bool = False
    ecc_supported: bool = True
    utilization: int = 0
    temperature: int = 40
    # Some cards (MIG slices, vGPUs) have no utilisation counter.
    utilization_supported: bool = True


@attrs.define
class _Event:
    device: Any
    eventData: int


class FakeNvml:
    """Behaves like pynvml for the calls GpuDiscovery makes; errors are pynvml's own classes."""

    def __init__(self, cards: list[FakeCard] | None = None, *, driver: bool = True) -> None:
        self.cards = cards if cards is not None else [FakeCard()]
        self.driver = driver
        self.events: list[_Event] = []
        # Set to make every call after nvmlInit hang until it is released.
        self.hang = threading.Event()
        self.release = threading.Event()

    def _check(self) -> None:
        if self.hang.is_set():
            self.release.wait(30)

    def xid(self, index: int, xid: int) -> None:
        self.events.append(_Event(device=index, eventData=xid))

    def nvmlInit(self) -> None:
        if not self.driver:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check()
        if self.cards[index].lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index

    def _card(self, handle: int) -> FakeCard:
        card = self.cards[handle]
        if card.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return card

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._card(handle).name

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._card(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        card = self._card(handle)
        return pynvml.c_nvmlMemory_t(total=card.total, free=card.total - card.used, used=card.used)

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter_type: int) -> int:
        card = self._card(handle)
        if not card.ecc_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert (error_type, counter_type) == (
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        return card.uncorrected_ecc

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        card = self._card(handle)
        if not card.ecc_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return card.pages_pending

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        card = self._card(handle)
        if not card.utilization_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=card.utilization, memory=0)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._card(handle).temperature

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, event_set: Any) -> None:
        assert event_types == pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> _Event:
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)
