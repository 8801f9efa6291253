"""The memory one replica of a model needs, by engine: weights, the KV cache at a context, and overhead.

The KV cache is layers × KV heads × head dimension × (keys + values) × the
cache's element size, per token; each engine has its own default element:
llama.cpp keeps f16 (`--cache-type-k`/`--cache-type-v` change it), vLLM and
SGLang the model's dtype (`--kv-cache-dtype fp8` halves it). The overhead
(compute buffers, CUDA context, vLLM's graphs) is a rule of thumb, stated as
such: docs/placement.md says how far the estimate was from real engines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from llmgw.capacity.shape import ModelShape

MIB = 1 << 20
GIB = 1 << 30
# vLLM's own --gpu-memory-utilization (0.32): the share of each card, or on a CPU of the node's
# memory, it takes at start whatever the model needs: the weights, activations, and in all the rest
# the KV cache. It refuses to start where that much is not free.
VLLM_MEMORY_UTILIZATION = 0.92
# A profile's env that changes what a replica holds: vLLM's CPU build takes this many GiB of KV
# cache, in place of a share of the node's memory. The admin API passes these, and only these, to
# the planner (a profile's env may hold tokens).
MEMORY_ENV = ("VLLM_CPU_KVCACHE_SPACE",)
# llama.cpp's cache types -> bytes per element (block types: block bytes / block elements).
_LLAMACPP_CACHE = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}
# Engines that load no weights: the sim engine answers from nothing.
_WEIGHTLESS = frozenset({"sim"})


def loads_weights(engine: str) -> bool:
    """Whether an engine's replicas hold the model's weights (the sim's hold nothing)."""
    return engine not in _WEIGHTLESS


# (fraction of the weights, flat bytes) each engine needs beyond weights and cache: llama.cpp's
# compute buffers; vLLM's and SGLang's activations, CUDA graphs and context.
_OVERHEAD = {"llamacpp": (0.05, 256 * MIB), "vllm": (0.10, 1024 * MIB), "sglang": (0.10, 1024 * MIB)}


@attrs.frozen
class Estimate:
    """What one replica needs, in bytes, at context tokens for each of parallel sequences."""

    engine: str
    weights_bytes: int
    kv_bytes_per_token: int
    # The cache's element, as the engine will keep it: "f16", "bf16", "fp8".
    kv_type: str
    context: int
    parallel: int
    kv_bytes: int
    overhead_bytes: int
    total_bytes: int
    # The share of each card's memory (without cards, of the node's) the engine takes at start,
    # whatever the model needs: vLLM's --gpu-memory-utilization. 0: it takes the estimate alone.
    claim: float = 0.0
    # Where set, the KV cache's bytes are the profile's (VLLM_CPU_KVCACHE_SPACE,
    # --kv-cache-memory-bytes), not context × parallel: the tokens it holds.
    kv_tokens: int = 0


def flag(args: Sequence[str], *names: str) -> str | None:
    """The value of the last of names in args, as `--flag value` or `--flag=value`."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def kv_element(engine: str, shape: ModelShape, args: Sequence[str] = ()) -> tuple[str, float, float]:
    """The cache's element name and the bytes of a key element and a value element, as engine keeps them."""
    if engine == "llamacpp":
        k = (flag(args, "--cache-type-k", "-ctk") or "f16").lower()
        v = (flag(args, "--cache-type-v", "-ctv") or "f16").lower()
        name = k if k == v else f"{k}/{v}"
        return name, _LLAMACPP_CACHE.get(k, 2.0), _LLAMACPP_CACHE.get(v, 2.0)
    kv_dtype = (flag(args, "--kv-cache-dtype") or "auto").lower()
    if kv_dtype.startswith("fp8"):
        return kv_dtype, 1.0, 1.0
    name = {4: "f32", 2: "bf16" if shape.format == "safetensors" else "f16", 8: "f64"}.get(
        shape.dtype_bytes, ""
    )
    return name, float(shape.dtype_bytes), float(shape.dtype_bytes)


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def vllm_memory(args: Sequence[str], env: Mapping[str, str], on_gpu: bool) -> tuple[float, int | None]:
    """vLLM's claim on memory as a profile sets it: (the share it takes at start, 0 for none; the KV
    cache's fixed bytes, None for what that share leaves).

    `--kv-cache-memory-bytes`, and on a CPU `VLLM_CPU_KVCACHE_SPACE` (whole GiB), fix the cache, and
    vLLM then takes what the model needs; otherwise it takes `--gpu-memory-utilization` of each card,
    or on a CPU (despite the name) of the node's memory.
    """
    fixed = _number(flag(args, "--kv-cache-memory-bytes"))
    space = env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if fixed is None and not on_gpu and space.strip().isdigit():
        fixed = float(int(space) * GIB)
    if fixed is not None:
        return 0.0, int(fixed)
    return _number(flag(args, "--gpu-memory-utilization")) or VLLM_MEMORY_UTILIZATION, None


def estimate(
    shape: ModelShape,
    engine: str,
    *,
    context: int,
    parallel: int = 1,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    on_gpu: bool = True,
) -> Estimate:
    """What one replica of shape needs on engine at context × parallel, on cards or (on_gpu False) in RAM.

    For vLLM, what its profile sets (args, env) decides: a fixed KV cache is that many bytes
    whatever the context; otherwise the estimate is the least it needs, and `claim` the share of
    the memory it takes.
    """
    if engine in _WEIGHTLESS:
        return Estimate(engine, 0, 0, "", context, parallel, 0, 0, 0)
    kv_type, k_bytes, v_bytes = kv_element(engine, shape, args)
    per_token = round(shape.k_per_token * k_bytes + shape.v_per_token * v_bytes)
    kv = per_token * context * parallel
    claim, fixed_kv = vllm_memory(args, env or {}, on_gpu) if engine == "vllm" else (0.0, None)
    kv_tokens = 0
    if fixed_kv is not None:
        kv, kv_tokens = fixed_kv, fixed_kv // max(per_token, 1)
    fraction, flat = _OVERHEAD.get(engine, _OVERHEAD["vllm"])
    overhead = round(shape.weights_bytes * fraction) + flat
    return Estimate(
        engine=engine,
        weights_bytes=shape.weights_bytes,
        kv_bytes_per_token=per_token,
        kv_type=kv_type,
        context=context,
        parallel=parallel,
        kv_bytes=kv,
        overhead_bytes=overhead,
        total_bytes=shape.weights_bytes + kv + overhead,
        claim=claim,
        kv_tokens=kv_tokens,
    )


def gigabytes(n: float) -> str:
    """21.4 GB: decimal, one place, as a card's memory is sold."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
