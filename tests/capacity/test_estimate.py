"""What one replica needs, by engine: the cache's element size is each engine's default."""

from __future__ import annotations

from pathlib import Path

from llmgw.capacity.estimate import estimate
from llmgw.capacity.shape import read_shape
from tests.capacity.models import Q, write_gguf, write_hf_directory


def test_llamacpp_keeps_an_f16_cache_whatever_the_weights_quantisation(tmp_path: Path):
    shape = read_shape(
        write_gguf(tmp_path / "m.gguf", qtype=Q.Q4_K, layers=2, width=256, heads=4, kv_heads=2)[0]
    )
    e = estimate(shape, "llamacpp", context=8192, parallel=4)
    # layers × KV heads × head dimension × (keys + values) × 2 bytes
    assert e.kv_bytes_per_token == 2 * 2 * 64 * 2 * 2
    assert (e.kv_type, e.kv_bytes) == ("f16", e.kv_bytes_per_token * 8192 * 4)
    assert e.total_bytes == e.weights_bytes + e.kv_bytes + e.overhead_bytes


def test_a_quantised_llamacpp_cache_asked_for_in_the_profile_is_counted_at_its_size(tmp_path: Path):
    shape = read_shape(write_gguf(tmp_path / "m.gguf")[0])
    f16 = estimate(shape, "llamacpp", context=1024)
    q8 = estimate(shape, "llamacpp", context=1024, args=["-ctk", "q8_0", "--cache-type-v=q8_0"])
    assert q8.kv_type == "q8_0"
    assert q8.kv_bytes_per_token == round(f16.kv_bytes_per_token * 34 / 64)


def test_vllm_keeps_the_models_dtype_unless_told_fp8(tmp_path: Path):
    shape = read_shape(write_hf_directory(tmp_path / "hf", layers=2, kv_heads=1, head_dim=64))
    bf16 = estimate(shape, "vllm", context=4096)
    assert (bf16.kv_type, bf16.kv_bytes_per_token) == ("bf16", 2 * 1 * 64 * 2 * 2)
    fp8 = estimate(shape, "vllm", context=4096, args=["--kv-cache-dtype", "fp8"])
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token // 2


def test_the_sim_engine_needs_nothing(tmp_path: Path):
    shape = read_shape(write_gguf(tmp_path / "m.gguf")[0])
    assert estimate(shape, "sim", context=4096).total_bytes == 0
