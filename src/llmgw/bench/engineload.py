"""An engine's queue depth and KV-cache occupancy, found in its metrics page under its own names.

Each engine names these differently (and vLLM renamed its cache gauge), and
the sim engine has neither: a name not found is "not reported", never 0,
which would read as an idle engine.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

# Requests waiting for a slot, summed over the page's label sets.
QUEUE_NAMES = ("llamacpp:requests_deferred", "vllm:num_requests_waiting", "sglang:num_queue_reqs")
# KV-cache occupancy, 0 to 1; the highest of the page's label sets. llama-server b11434's page
# has no cache gauge (its kv_cache_usage_ratio is gone): kept for older builds, read as absent there.
KV_NAMES = (
    "llamacpp:kv_cache_usage_ratio",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
)


@attrs.frozen
class EngineLoad:
    """One reading of one replica; None where its engine does not report the figure."""

    queue_depth: float | None
    kv_cache: float | None


def _values(samples: Mapping[str, float], names: tuple[str, ...]) -> list[float]:
    for name in names:
        found = [v for key, v in samples.items() if key == name or key.startswith(name + "{")]
        if found:
            return found
    return []


def engine_load(samples: Mapping[str, float]) -> EngineLoad:
    """The queue and the cache in samples (adminapi/engine_metrics.py's parse)."""
    queue = _values(samples, QUEUE_NAMES)
    kv = _values(samples, KV_NAMES)
    return EngineLoad(queue_depth=sum(queue) if queue else None, kv_cache=max(kv) if kv else None)


def peak(readings: list[EngineLoad]) -> EngineLoad:
    """The highest of each figure over readings (summed queues of one moment are one reading)."""
    queues = [r.queue_depth for r in readings if r.queue_depth is not None]
    kvs = [r.kv_cache for r in readings if r.kv_cache is not None]
    return EngineLoad(queue_depth=max(queues) if queues else None, kv_cache=max(kvs) if kvs else None)
