"""What one `llmgw ctl bench` run measured: one `Level` per concurrency, kept as a `Run`.

One attrs class that ctl prints, the admin API stores and the models page
draws, so a field added here reaches all three.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Level:
    """One concurrency held for the run's seconds: latency, throughput and the engine's own load."""

    concurrency: int = attrs.field(metadata={"doc": "Streaming requests kept in flight at once."})
    requests: int = attrs.field(metadata={"doc": "Requests that streamed their reply to the end."})
    errors: int = attrs.field(metadata={"doc": "Requests that failed: an HTTP error, a broken stream."})
    error: str = attrs.field(metadata={"doc": "The first failure, in the gateway's words; empty when none."})
    seconds: float = attrs.field(metadata={"doc": "From the first request sent to the last reply ended."})
    output_tokens: int = attrs.field(metadata={"doc": "Completion tokens, as the engine counted them."})
    ttft_p50_ms: float | None = attrs.field(
        metadata={"doc": "Median time to the first token; null when no request produced one."}
    )
    ttft_p95_ms: float | None = attrs.field(metadata={"doc": "95th percentile time to the first token."})
    itl_p50_ms: float | None = attrs.field(
        metadata={
            "doc": "Median inter-token latency: per request, (last token - first) / (tokens - 1); "
            "null when no request produced two tokens."
        }
    )
    output_tokens_per_s: float = attrs.field(metadata={"doc": "output_tokens / seconds."})
    requests_per_s: float = attrs.field(metadata={"doc": "requests / seconds."})
    queue_depth_max: float | None = attrs.field(
        metadata={
            "doc": "The most requests the engine held waiting, over the replicas' metrics read during "
            "the level; null when the engine does not report it."
        }
    )
    kv_cache_max: float | None = attrs.field(
        metadata={
            "doc": "The highest KV-cache occupancy (0 to 1) the engine reported during the level; null "
            "when it does not report it."
        }
    )
    engine_readings: int = attrs.field(
        metadata={"doc": "How many times the replicas' metrics were read during the level."}
    )


@attrs.frozen
class Run:
    """One `llmgw ctl bench MODEL`: the load it offered, and what each concurrency got."""

    model: str
    started_at: str = attrs.field(metadata={"doc": "When the run began, ISO 8601 in UTC."})
    prompt_tokens: int = attrs.field(metadata={"doc": "Words in each prompt (about as many tokens)."})
    max_tokens: int = attrs.field(metadata={"doc": "Each request's max_tokens."})
    seconds: float = attrs.field(metadata={"doc": "How long each concurrency was held."})
    levels: list[Level]
    engines: list[str] = attrs.field(
        factory=list, metadata={"doc": "The engines of the replicas whose metrics were read."}
    )


# The admin API document's components (adminapi/openapi.py).
SHAPES: tuple[type, ...] = (Run,)
