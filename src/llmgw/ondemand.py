"""What a model's definition says of its replica count: fixed (`replicas: N`) or on demand (`scale`).

Both the gateway (which holds a request for a cold model) and the control plane (which decides
how many replicas run) read a model's scale, so it lives below both.
"""

from __future__ import annotations

from llmgw.config import ModelConfig, ScaleConfig

# How long a cold start is allowed by default, by engine: llama.cpp maps its weights and serves in
# seconds (most of the bound is a download); vLLM and SGLang compile, profile memory and capture
# graphs for minutes before their first answer.
_COLD_START_S = {"llamacpp": 120.0, "sim": 120.0, "vllm": 900.0, "sglang": 900.0}
_UNKNOWN_ENGINE_S = 900.0


def scale_of(model: ModelConfig) -> ScaleConfig:
    """The model's scale: its own, or `replicas: N` as min N and max N."""
    if model.scale is not None:
        return model.scale
    return ScaleConfig(min=model.replicas, max=model.replicas)


def on_demand(model: ModelConfig) -> bool:
    """Whether the fleet starts and stops the model's replicas by its requests (it has a `scale`)."""
    return model.scale is not None and not model.endpoints


def cold_start_bound_s(model: ModelConfig) -> float:
    """How long a request is held while the model starts: timeouts.cold_start_s, else the longest default
    of its profiles' engines (the start may land on any profile: one placed on its vLLM profile, after a
    llama.cpp one found no node, was held only llama.cpp's two minutes)."""
    if model.timeouts.cold_start_s:
        return model.timeouts.cold_start_s
    engines = [p.engine for p in model.profiles] or [""]
    return max(_COLD_START_S.get(engine, _UNKNOWN_ENGINE_S) for engine in engines)
