"""The memory one replica of a model needs, by engine: weights, the KV cache at a context, and overhead.

The KV cache is layers × KV heads × head dimension × (keys + values) × the
cache's element size, per token; each engine has its own default element:
llama.cpp keeps f16 (`--cache-type-k`/`--cache-type-v` change it), vLLM and
SGLang the model's dtype (`--kv-cache-dtype fp8` halves it). The overhead
(compute buffers, CUDA context, vLLM's graphs) is a rule of thumb, stated as
such: docs/placement.md says how far the estimate was from real engines.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llmgw.capacity.shape import ModelShape

MIB = 1 << 20
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


def estimate(
    shape: ModelShape, engine: str, *, context: int, parallel: int = 1, args: Sequence[str] = ()
) -> Estimate:
    """What one replica of shape needs on engine at context × parallel."""
    if engine in _WEIGHTLESS:
        return Estimate(engine, 0, 0, "", context, parallel, 0, 0, 0)
    kv_type, k_bytes, v_bytes = kv_element(engine, shape, args)
    per_token = round(shape.k_per_token * k_bytes + shape.v_per_token * v_bytes)
    kv = per_token * context * parallel
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
    )


def gigabytes(n: float) -> str:
    """21.4 GB: decimal, one place, as a card's memory is sold."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
