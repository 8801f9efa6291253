"""What the node tells the control plane about itself: GPUs, memory, fabrics, storage, labels, weights.

Everything is read in threads by `refresh` (the agent runs `run`, which
refreshes every heartbeat interval, and at once when `disk_changed` is set: a
download that filled the disk), and kept here, so building a Register or a
Heartbeat never waits on NVML or a disk. Register carries all of it; a
Heartbeat carries memory always and each list only when it changed since the
stream last heard it, with its *_changed flag set, so an empty list there
means "none" and never "nothing to say".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from llmgw.agent.discovery.fabrics import INFINIBAND, discover_fabrics
from llmgw.agent.discovery.gpus import GpuDiscovery, GpuReading
from llmgw.agent.discovery.memory import discover_memory
from llmgw.agent.discovery.storage import Statvfs, discover_storage
from llmgw.config import AgentConfig
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

# GPU memory in use moves all the time; a change smaller than this is not worth a heartbeat.
_GPU_MEMORY_STEP_MB = 512


class NodeReport:
    """The node's description as of the last refresh, and what the current stream has heard of it."""

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        gpus: GpuDiscovery | None = None,
        weights: Callable[[], list[pb.Weights]] = list,
        infiniband: Path = INFINIBAND,
        statvfs: Statvfs = os.statvfs,
        disk_changed: asyncio.Event | None = None,
    ) -> None:
        self._cfg = cfg
        # Set by whoever changed a disk a lot at once (the weights cache, when a download filled
        # it): read again now, rather than at the next interval.
        self._disk_changed = disk_changed if disk_changed is not None else asyncio.Event()
        # Set when a refresh finds something the stream has not heard: the agent's client sends a
        # heartbeat at once rather than at its next tick.
        self.changed = asyncio.Event()
        self._gpu_discovery = gpus if gpus is not None else GpuDiscovery()
        self._weights = weights
        self._infiniband = infiniband
        self._statvfs = statvfs
        self.gpus: list[pb.Gpu] = []
        self.memory: pb.Memory | None = None
        self.fabrics: list[pb.Fabric] = []
        self.storage: list[pb.Storage] = []
        self.warnings: list[str] = []
        self._warned: set[str] = set()
        # What the control plane last heard on this stream: fingerprints of each list.
        self._sent: dict[str, object] = {}

    @property
    def gpu_readings(self) -> dict[int, GpuReading]:
        """Each GPU's utilisation and temperature at the last refresh, by index."""
        return self._gpu_discovery.readings

    @property
    def storage_dirs(self) -> list[Path]:
        return [self._cfg.weights_dir, *(Path(d) for d in self._cfg.model_dirs)]

    async def refresh(self) -> None:
        """Read everything again, each part in a thread."""
        gpus, memory, fabrics, storage = await asyncio.gather(
            self._gpu_discovery.scan(),
            discover_memory(),
            discover_fabrics(self._cfg.fabric, self._cfg.hcas, self._infiniband),
            discover_storage(self.storage_dirs, self._statvfs),
        )
        for gpu in gpus:
            if not gpu.healthy and gpu.unhealthy_reason not in self._warned:
                self._warned.add(gpu.unhealthy_reason)
                log.warning(
                    "a GPU is unhealthy and takes no work", index=gpu.index, reason=gpu.unhealthy_reason
                )
        for warning in fabrics.warnings:
            if warning not in self._warned:
                self._warned.add(warning)
                log.warning(warning)
        self.gpus, self.memory, self.fabrics, self.storage = gpus, memory, fabrics.fabrics, storage
        self.warnings = fabrics.warnings
        if _storage_print(storage) != self._sent.get("storage"):
            self.changed.set()

    async def run(self, interval_s: float) -> None:
        """Refresh every interval_s, or sooner when a disk changed, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._disk_changed.wait()
            self._disk_changed.clear()
            try:
                await self.refresh()
            except Exception:
                # One failed read must not end discovery for good; the last values stand meanwhile.
                log.exception("reading the node's hardware failed; keeping the previous values")

    def fill_register(self, register: pb.Register) -> pb.Register:
        """Add everything to a Register; the new stream has then heard all of it."""
        weights = self._weights()
        register.gpus = list(self.gpus)
        if self.memory is not None:
            register.memory = self.memory
        register.fabrics = list(self.fabrics)
        register.storage = list(self.storage)
        register.weights = weights
        register.labels = dict(self._cfg.labels)
        register.warnings = [*register.warnings, *(w for w in self.warnings if w not in register.warnings)]
        self._sent = {
            "gpus": _gpu_print(self.gpus),
            "fabrics": _print(self.fabrics),
            "storage": _storage_print(self.storage),
            "weights": _print(weights),
        }
        # The new stream has heard everything: nothing is left to send at once.
        self.changed.clear()
        return register

    def fill_heartbeat(self, heartbeat: pb.Heartbeat) -> pb.Heartbeat:
        """Add memory, and each list that changed since the stream last heard it."""
        if self.memory is not None:
            heartbeat.memory = self.memory
        gpus = _gpu_print(self.gpus)
        if gpus != self._sent.get("gpus"):
            heartbeat.gpus_changed, heartbeat.gpus = True, list(self.gpus)
            self._sent["gpus"] = gpus
        fabrics = _print(self.fabrics)
        if fabrics != self._sent.get("fabrics"):
            heartbeat.fabrics_changed, heartbeat.fabrics = True, list(self.fabrics)
            self._sent["fabrics"] = fabrics
        storage = _storage_print(self.storage)
        if storage != self._sent.get("storage"):
            heartbeat.storage_changed, heartbeat.storage = True, list(self.storage)
            self._sent["storage"] = storage
        weights = self._weights()
        printed = _print(weights)
        if printed != self._sent.get("weights"):
            heartbeat.weights_changed, heartbeat.weights = True, weights
            self._sent["weights"] = printed
        return heartbeat


def _print(items: Sequence[object]) -> tuple[bytes, ...]:
    return tuple(bytes(item) for item in items)  # type: ignore[call-overload]


def _gpu_print(gpus: Sequence[pb.Gpu]) -> tuple[tuple[object, ...], ...]:
    return tuple(
        (g.index, g.uuid, g.gpu_class, g.healthy, g.unhealthy_reason, g.memory_used_mb // _GPU_MEMORY_STEP_MB)
        for g in gpus
    )


def _storage_print(storage: Sequence[pb.Storage]) -> tuple[tuple[object, ...], ...]:
    # Free space in steps of 1 GB, or of 1% on a disk under 100 GB: a heartbeat for every log line
    # written would be noise, and with whole GB only a small disk filling up was never told.
    return tuple((s.path, s.total_bytes, s.free_bytes // _storage_step(s.total_bytes)) for s in storage)


def _storage_step(total_bytes: int) -> int:
    return max(1, min(10**9, total_bytes // 100))
