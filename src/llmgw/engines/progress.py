"""Which series of an engine's metrics page say it is working: what the agent's stall probe reads.

An adapter declares them as its `progress` attribute (an engine without one is probed for health
only). A series may carry labels (vLLM labels by model); the probe sums every sample of a name.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class ProgressMetrics:
    """The names of an engine's requests-in-flight gauge and the counters that move as it works."""

    # A gauge: requests the engine is generating for now (not those queued behind them).
    in_flight: str
    # Counters, at least one of which moves at every step while a request is in flight: tokens
    # generated, or decode calls. A counter the engine moves only when a request ends (llama.cpp's
    # tokens_predicted_total) is not enough alone: a long answer would look stalled.
    work: tuple[str, ...]
