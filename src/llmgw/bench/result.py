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
            "doc": "Median inter-token latency: the gaps between a stream's content chunks, over every "
            "request; null when no request produced two chunks. (Runs kept before TPOT was measured "
            "hold here the median of each request's (last token - first) / (tokens - 1).)"
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
    # The fields below came later: each has a default, so that runs kept before them still read.
    input_tokens: int | None = attrs.field(
        default=None,
        metadata={
            "doc": "Prompt tokens, as the engine counted them (its usage); null in runs kept before "
            "they were counted."
        },
    )
    requests_without_usage: int = attrs.field(
        default=0,
        metadata={
            "doc": "Requests whose stream carried no usage: their output tokens are their content "
            "chunks counted, their input tokens are not counted."
        },
    )
    total_tokens_per_s: float | None = attrs.field(
        default=None, metadata={"doc": "(input_tokens + output_tokens) / seconds."}
    )
    ttft_p99_ms: float | None = attrs.field(default=None, metadata={"doc": "99th percentile TTFT."})
    tpot_p50_ms: float | None = attrs.field(
        default=None,
        metadata={
            "doc": "Median time per output token after the first: per request, (end to end - TTFT) / "
            "(output tokens - 1); null when no request produced two tokens."
        },
    )
    tpot_p95_ms: float | None = attrs.field(default=None, metadata={"doc": "95th percentile TPOT."})
    tpot_p99_ms: float | None = attrs.field(default=None, metadata={"doc": "99th percentile TPOT."})
    itl_p95_ms: float | None = attrs.field(default=None, metadata={"doc": "95th percentile ITL."})
    itl_p99_ms: float | None = attrs.field(default=None, metadata={"doc": "99th percentile ITL."})
    e2e_p50_ms: float | None = attrs.field(
        default=None, metadata={"doc": "Median end-to-end latency: sent to the stream's end."}
    )
    e2e_p95_ms: float | None = attrs.field(default=None, metadata={"doc": "95th percentile end to end."})
    e2e_p99_ms: float | None = attrs.field(default=None, metadata={"doc": "99th percentile end to end."})


@attrs.frozen
class Run:
    """One `llmgw ctl bench MODEL`: the load it offered, and what each concurrency got."""

    model: str
    started_at: str = attrs.field(metadata={"doc": "When the run began, ISO 8601 in UTC."})
    prompt_tokens: int = attrs.field(
        metadata={
            "doc": "Words in each prompt, as `--prompt-tokens` asked; how many tokens they made is each "
            "level's input_tokens."
        }
    )
    max_tokens: int = attrs.field(metadata={"doc": "Each request's max_tokens."})
    seconds: float = attrs.field(metadata={"doc": "How long each concurrency was held."})
    levels: list[Level]
    engines: list[str] = attrs.field(
        factory=list, metadata={"doc": "The engines of the replicas whose metrics were read."}
    )
    served_by: list[str] = attrs.field(
        factory=list,
        metadata={
            "doc": "The catalog models that answered (the gateway's `x-llmgw-model`): the model, or its "
            "fallbacks; empty in runs kept before it was recorded."
        },
    )


def percent(fraction: float | None) -> str | None:
    """A 0-to-1 occupancy as a percentage with the precision it has: 0.0006 is "0.06%", not "0%"."""
    if fraction is None:
        return None
    share = fraction * 100
    if share == 0:
        return "0%"
    if share < 0.001:
        return "<0.001%"
    return f"{share:.3g}%"


def _each(total: int, requests: int) -> str:
    return f"{round(total / requests, 1):g}"


def describe(run: Run) -> str:
    """The load as the engine took it, in tokens, the same on the CLI and the models page.

    "8-word prompts (13 input tokens each), max_tokens 4 (4 output tokens each), 0.2 s per level":
    the prompt is words, and only the engine's usage says how many tokens they made.
    """
    counted = [x for x in run.levels if x.input_tokens is not None and x.requests > x.requests_without_usage]
    asked = sum(x.requests - x.requests_without_usage for x in counted)
    inputs = (
        f"{_each(sum(x.input_tokens or 0 for x in counted), asked)} input tokens each"
        if asked
        else "input tokens not reported"
    )
    answered = sum(x.requests for x in run.levels)
    outputs = (
        f"{_each(sum(x.output_tokens for x in run.levels), answered)} output tokens each"
        if answered
        else "no reply"
    )
    others = [m for m in run.served_by if m != run.model]
    through = f", served by its fallback {', '.join(others)}" if others else ""
    return (
        f"{run.prompt_tokens}-word prompts ({inputs}), max_tokens {run.max_tokens} ({outputs}), "
        f"{run.seconds:g} s per level{through}"
    )


# The admin API document's components (adminapi/openapi.py).
SHAPES: tuple[type, ...] = (Run,)
