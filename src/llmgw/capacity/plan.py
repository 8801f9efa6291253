"""A capacity plan: a model's shape, its estimate per profile, and where each fits.

What `llmgw ctl model plan` prints and answers with `--json`. The context and
parallel sequences come from the command line, else from the profile's own
engine arguments (llama-server's `-c` is shared by its `-np` slots; vLLM's
`--max-model-len`, SGLang's `--context-length`), else the model's trained
context; the sequences, from vLLM's `--max-num-seqs` and SGLang's
`--max-running-requests`, else the agent's own default, which it passes them
(agent.yaml `engines.<name>.parallel`, 4); llama.cpp's `-np`, else one.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llmgw.capacity.estimate import estimate, flag, loads_weights
from llmgw.capacity.fit import ProfileFit, cards_needed, judge
from llmgw.capacity.fleet import NodeCapacity, ProfileShape
from llmgw.capacity.shape import ModelShape, WeightsFile

# When neither the command, the profile nor the model's files say.
DEFAULT_CONTEXT = 4096
# The engine a model's format is served with when no profile names one.
DEFAULT_ENGINE = {"gguf": "llamacpp", "safetensors": "vllm"}
# The sequences an agent has vLLM and SGLang serve at once when the profile says none: agent.yaml's
# engines.<name>.parallel default (config EngineOptions), passed as --max-num-seqs and
# --max-running-requests. llama.cpp's cache is -c cells however many slots share it.
AGENT_PARALLEL = 4


@attrs.frozen
class Plan:
    source: str
    format: str
    architecture: str
    files: list[WeightsFile]
    weights_bytes: int
    # The first profile's engine's: the cache's bytes for one token, keys and values, all layers.
    kv_bytes_per_token: int
    context: int
    parallel: int
    profiles: list[ProfileFit]
    # What the plan cannot promise in its figures: a context past the one the model was trained on.
    warnings: list[str] = attrs.field(factory=list)


def _intflag(args: Sequence[str], *names: str) -> int | None:
    value = flag(args, *names)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def sequences(profile: ProfileShape) -> tuple[int | None, int | None]:
    """The context per sequence and the sequences a profile's engine arguments ask for, where they say."""
    args = profile.args
    if profile.engine == "llamacpp":
        total = _intflag(args, "-c", "--ctx-size")
        parallel = _intflag(args, "-np", "--parallel")
        if total is not None and total > 0:
            return total // (parallel or 1), parallel
        return None, parallel
    if profile.engine == "sglang":
        return _intflag(args, "--context-length"), _intflag(args, "--max-running-requests") or AGENT_PARALLEL
    if profile.engine == "vllm":
        return _intflag(args, "--max-model-len"), _intflag(args, "--max-num-seqs") or AGENT_PARALLEL
    return _intflag(args, "--max-model-len"), None


def make_plan(
    shape: ModelShape,
    profiles: Sequence[ProfileShape],
    nodes: Sequence[NodeCapacity],
    *,
    context: int | None = None,
    parallel: int | None = None,
    name: str = "",
) -> Plan:
    """shape's estimate for every profile (none: the engine its format is served with, on any cards).

    name is what the warnings call the model (a catalog model's name, a file's).
    """
    fits: list[ProfileFit] = []
    warnings: list[str] = []
    judged: Sequence[ProfileShape | None] = list(profiles) or [None]
    for profile in judged:
        engine = profile.engine if profile is not None else DEFAULT_ENGINE[shape.format]
        said_context, said_parallel = sequences(profile) if profile is not None else (None, None)
        ctx = context or said_context or shape.context_length or DEFAULT_CONTEXT
        par = parallel or said_parallel or 1
        args = profile.args if profile is not None else []
        env = profile.env if profile is not None else {}
        on_gpu = profile is None or cards_needed(profile) > 0
        if context:
            origin = f"--context {context}"
        elif said_context and profile is not None:
            origin = f"profile {profile.name}'s context of {said_context:,} tokens a sequence"
        else:
            origin = ""
        past = _past_training(shape, engine, ctx, origin, name or shape.source)
        if past and past not in warnings:
            warnings.append(past)
        est = estimate(shape, engine, context=ctx, parallel=par, args=args, env=env, on_gpu=on_gpu)
        fits.append(judge(est, profile, nodes))
    first = fits[0].estimate
    return Plan(
        source=shape.source,
        format=shape.format,
        architecture=shape.architecture,
        files=list(shape.files),
        weights_bytes=shape.weights_bytes,
        kv_bytes_per_token=first.kv_bytes_per_token,
        context=first.context,
        parallel=first.parallel,
        profiles=fits,
        warnings=warnings,
    )


# What each engine does with a context past the model's trained one.
_PAST_TRAINING = {
    "llamacpp": "llama.cpp allocates the cache for all of it, but gives a sequence at most {trained:,}",
    "vllm": "vLLM refuses to start with it unless the profile's env sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
    "sglang": (
        "SGLang refuses to start with it unless the profile's env sets "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
    ),
}


def _past_training(shape: ModelShape, engine: str, context: int, origin: str, name: str) -> str:
    """A warning when origin (a context asked for) is longer than the model was trained on; else ""."""
    trained = shape.context_length
    if not origin or not trained or context <= trained or not loads_weights(engine):
        return ""
    what = _PAST_TRAINING.get(engine, "").format(trained=trained)
    return (
        f"{origin} is past the {trained:,} tokens {name} was trained on: {what}, and its answers "
        f"that far are unreliable; the figures are for {context:,} all the same"
    )
