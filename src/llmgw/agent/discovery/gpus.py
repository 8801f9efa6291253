"""GPUs through NVML: what each card is, how much of its memory is in use, and whether it is healthy.

NVML is reached through a seam (`Nvml`, the handful of pynvml functions used
here), so tests describe cards this machine does not have with a fake. Every
NVML call blocks, sometimes for seconds on a card that is failing, so the agent
only ever calls `GpuDiscovery.scan`, which reads in a thread and does not wait
for a read that hangs.

A card is unhealthy, and kept out of placement, after an XID error that is not
the application's own doing, with uncorrected ECC errors or retired pages
waiting for a reset, or when it stopped answering NVML. An XID is remembered
until the agent restarts: the event is delivered once, and a card that fell off
the bus does not come back by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from typing import Any, Protocol

import attrs
import pynvml
import structlog

from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

# XIDs a program causes (a bad memory access, a kernel killed on purpose): the
# card is fine and the next engine on it will be too. The same list Kubernetes'
# NVIDIA device plugin skips.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# What the XIDs an operator meets most often mean, for the reason shown on the node.
_XID_MEANINGS = {
    48: "a double-bit ECC error",
    61: "an internal microcontroller breakpoint",
    62: "an internal microcontroller halt",
    63: "an ECC page retirement or row remap",
    64: "an ECC page retirement or row remap failure",
    74: "an NVLink error",
    79: "the GPU has fallen off the bus",
    92: "a high single-bit ECC error rate",
    94: "a contained ECC error",
    95: "an uncontained ECC error",
    119: "the GSP did not answer",
    120: "a GSP error",
}

# Sizes cards are sold with, in GB. NVML reports what the driver can use, a
# little under the label (an 80 GB H100 shows 79.6 GiB), so the class takes the
# nearest label rather than a rounded number nobody would recognise.
_MARKETED_GB = (
    4,
    6,
    8,
    10,
    11,
    12,
    16,
    20,
    24,
    32,
    40,
    48,
    64,
    80,
    94,
    96,
    128,
    141,
    144,
    180,
    188,
    192,
    288,
)

# Words in a card's name that say who made it or how it is packaged, not what it is.
_NOISE = re.compile(r"^(nvidia|geforce|tesla|quadro|sxm\d*|pcie|hbm\d*e?|nvl|\d+gb|gb|\d+g)$")

DEFAULT_SCAN_TIMEOUT_S = 10.0


class Nvml(Protocol):
    """The pynvml functions discovery calls; `pynvml` itself in production, a fake in tests."""

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...


@attrs.frozen
class GpuReading:
    """What a card is doing, for the agent's metrics page; None where the card cannot say."""

    utilization_percent: float | None = None
    temperature_celsius: float | None = None


def gpu_class(name: str, memory_total_bytes: int) -> str:
    """The class placement matches profiles on: "NVIDIA H100 80GB HBM3" with 79.6 GiB is "h100-80g"."""
    words = re.split(r"[\s\-_]+", name.lower())
    model = "".join(w for w in words if w and not _NOISE.match(w)) or "gpu"
    gib = memory_total_bytes / 2**30
    label = min(_MARKETED_GB, key=lambda gb: abs(gb - gib))
    if abs(label - gib) > label * 0.1:
        # A size nobody sells (a MIG slice, a card from the future): say what it has.
        label = round(gib)
    return f"{model}-{label}g"


def _xid_reason(xid: int) -> str:
    meaning = _XID_MEANINGS.get(xid)
    return f"XID {xid}: {meaning}" if meaning else f"XID {xid}"


class GpuDiscovery:
    """Reads the node's GPUs; `scan` is the only method the event loop calls."""

    def __init__(self, nvml: Nvml | None = None, *, scan_timeout_s: float = DEFAULT_SCAN_TIMEOUT_S) -> None:
        self._nvml: Any = pynvml if nvml is None else nvml
        self._scan_timeout_s = scan_timeout_s
        self._started = False
        self._available = False
        self._events: Any = None
        # uuid -> why the card is unhealthy, for conditions that do not clear (XIDs).
        self._sticky: dict[str, str] = {}
        self._last: list[pb.Gpu] = []
        # Index -> utilisation and temperature at the last read, for the metrics page only: placement
        # needs neither, and the stream would carry them every heartbeat for nothing.
        self.readings: dict[int, GpuReading] = {}
        self._pending: asyncio.Future[list[pb.Gpu]] | None = None
        # One read at a time: NVML is thread-safe, but a read that hangs must not gain company.
        self._lock = threading.Lock()

    async def scan(self) -> list[pb.Gpu]:
        """Every GPU as it is now; when NVML does not answer in time, the last ones marked unhealthy."""
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().run_in_executor(None, self.read)
        # asyncio.wait, not wait_for: a thread cannot be cancelled, and the next scan must find
        # the read still running rather than start a second one behind it.
        done, _ = await asyncio.wait({self._pending}, timeout=self._scan_timeout_s)
        if done:
            gpus = self._pending.result()
            self._last = gpus
            return gpus
        why = f"stopped answering NVML (no answer within {self._scan_timeout_s:g} s)"
        log.warning("NVML did not answer; reporting every GPU unhealthy", timeout_s=self._scan_timeout_s)
        return [_unhealthy(gpu, why) for gpu in self._last]

    def read(self) -> list[pb.Gpu]:
        """Every GPU as it is now. Blocking: call through `scan`."""
        with self._lock:
            if not self._started:
                self._start()
            if not self._available:
                return []
            self._collect_xids()
            try:
                count = self._nvml.nvmlDeviceGetCount()
            except pynvml.NVMLError as exc:
                why = f"stopped answering NVML ({exc})"
                return [_unhealthy(gpu, why) for gpu in self._last]
            return [self._read_one(index) for index in range(count)]

    def _start(self) -> None:
        self._started = True
        try:
            self._nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            # No driver or no library: a CPU node, which is a fine thing to be.
            log.info("no NVIDIA GPU can be read on this node", reason=str(exc))
            return
        self._available = True
        try:
            self._events = self._nvml.nvmlEventSetCreate()
            for index in range(self._nvml.nvmlDeviceGetCount()):
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    self._nvml.nvmlDeviceRegisterEvents(
                        handle, pynvml.nvmlEventTypeXidCriticalError, self._events
                    )
                except pynvml.NVMLError as exc:
                    log.info("this GPU does not report XID errors", index=index, reason=str(exc))
        except pynvml.NVMLError as exc:
            log.warning("cannot watch GPUs for XID errors", reason=str(exc))
            self._events = None

    def _collect_xids(self) -> None:
        if self._events is None:
            return
        while True:
            try:
                event = self._nvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError_Timeout:
                return
            except pynvml.NVMLError as exc:
                log.warning("reading XID events failed", reason=str(exc))
                return
            xid = int(event.eventData)
            if xid in APPLICATION_XIDS:
                continue
            try:
                uuid = self._nvml.nvmlDeviceGetUUID(event.device)
            except pynvml.NVMLError:
                continue
            reason = _xid_reason(xid)
            if uuid not in self._sticky:
                log.error("a GPU reported an XID error; it takes no more work", gpu=uuid, reason=reason)
                self._sticky[uuid] = reason

    def _read_one(self, index: int) -> pb.Gpu:
        gpu = pb.Gpu(index=index, healthy=True)
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            gpu.uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
            gpu.name = _text(self._nvml.nvmlDeviceGetName(handle))
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            gpu.memory_total_mb = int(memory.total) // 2**20
            gpu.memory_used_mb = int(memory.used) // 2**20
            gpu.gpu_class = gpu_class(gpu.name, int(memory.total))
        except pynvml.NVMLError as exc:
            known = next((g for g in self._last if g.index == index), None)
            return _unhealthy(known or gpu, f"stopped answering NVML ({exc})")
        self.readings[index] = self._reading(handle)
        reason = self._sticky.get(gpu.uuid) or self._memory_fault(handle)
        return _unhealthy(gpu, reason) if reason else gpu

    def _reading(self, handle: Any) -> GpuReading:
        utilization = temperature = None
        # Each on its own: a card without a sensor (some MIG and vGPU setups) still says the other.
        with contextlib.suppress(pynvml.NVMLError):
            utilization = float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        with contextlib.suppress(pynvml.NVMLError):
            temperature = float(self._nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
        return GpuReading(utilization, temperature)

    def _memory_fault(self, handle: Any) -> str:
        try:
            errors = self._nvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
            if errors:
                return f"{errors} uncorrected ECC errors since the driver loaded"
        except pynvml.NVMLError:
            pass  # Not every card has ECC; one without it has no ECC faults to report.
        try:
            if self._nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                return "retired memory pages are waiting for the GPU to be reset"
        except pynvml.NVMLError:
            pass
        return ""


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes.
    return value.decode() if isinstance(value, bytes) else value


def _unhealthy(gpu: pb.Gpu, reason: str) -> pb.Gpu:
    copy = pb.Gpu().parse(bytes(gpu))
    copy.healthy = False
    copy.unhealthy_reason = reason
    return copy
