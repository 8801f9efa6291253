"""A model's shape as its files' headers state it: the weights' bytes, and what a token adds to the cache.

One reader for both kinds of model an engine loads: a GGUF file (one file, or
the parts of a split one) and a Hugging Face directory (config.json and its
.safetensors files). Neither reads a byte of the weights themselves, so
planning a 400 GB model takes as long as planning a 5 MB one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from llmgw.capacity.ggufmeta import GgufHeader, HeaderError, read_header, split_parts
from llmgw.capacity.safetensorsmeta import TORCH_DTYPE_BYTES, read_config, read_safetensors


@attrs.frozen
class WeightsFile:
    """One file of weights: its bytes, and the quantisations its tensors are stored in."""

    path: str
    bytes: int
    # "Q4_K 71%, Q6_K 26%, F32 3%": each type's share of the file's tensor bytes.
    quantisation: str


@attrs.frozen
class ModelShape:
    source: str
    format: Literal["gguf", "safetensors"]
    architecture: str
    files: tuple[WeightsFile, ...]
    layers: int
    # Over all layers, KV heads × head dimension: the elements a token adds to the keys, and to the values.
    k_per_token: int
    v_per_token: int
    # The model's own element size, which vLLM's and SGLang's caches take by default.
    dtype_bytes: int
    # The context the model was trained for; 0 when its files do not say.
    context_length: int

    @property
    def weights_bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def read_shape(path: Path) -> ModelShape:
    """The shape of the model at path: a GGUF file (any part of a split one) or a Hugging Face directory."""
    if path.is_dir():
        return _from_directory(path)
    if not path.exists():
        raise HeaderError(f"{path} does not exist")
    return _from_gguf(path)


def _mix(by_type: dict[str, int]) -> str:
    total = sum(by_type.values()) or 1
    ordered = sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {_share(n, total)}" for name, n in ordered)


def _share(n: int, total: int) -> str:
    percent = 100 * n / total
    return "<1%" if 0 < percent < 1 else f"{round(percent)}%"


def _from_gguf(path: Path) -> ModelShape:
    headers = [read_header(part) for part in split_parts(path)]
    files = []
    for header in headers:
        by_type: dict[str, int] = {}
        for tensor in header.tensors:
            by_type[tensor.type_name] = by_type.get(tensor.type_name, 0) + tensor.nbytes
        files.append(
            WeightsFile(path=str(header.path), bytes=header.weights_bytes, quantisation=_mix(by_type))
        )
    if not any(header.tensors for header in headers):
        # llama.cpp's ggml-vocab-*.gguf carry a model's hyperparameters and its tokenizer, and no
        # weights: planned as a model, they would read as gigabytes of cache for 0 MB of weights.
        raise HeaderError(f"{path} holds no tensors: it is a vocabulary or metadata file, not a model")
    main = next((h for h in headers if "general.architecture" in h.metadata), None)
    if main is None:
        raise HeaderError(f"{path} names no general.architecture: llama.cpp would not load it either")
    arch = str(main.metadata["general.architecture"])
    layers = _int(main, f"{arch}.block_count")
    heads = _per_layer(main, f"{arch}.attention.head_count", layers, None)
    kv_heads = _per_layer(main, f"{arch}.attention.head_count_kv", layers, heads)
    width = _int(main, f"{arch}.embedding_length")
    first_heads = max(heads) or 1
    k_dim = _int(main, f"{arch}.attention.key_length", width // first_heads)
    v_dim = _int(main, f"{arch}.attention.value_length", width // first_heads)
    return ModelShape(
        source=str(path),
        format="gguf",
        architecture=arch,
        files=tuple(files),
        layers=layers,
        k_per_token=sum(kv_heads) * k_dim,
        v_per_token=sum(kv_heads) * v_dim,
        dtype_bytes=2,
        context_length=_int(main, f"{arch}.context_length", 0),
    )


def _int(header: GgufHeader, key: str, default: int | None = None) -> int:
    value = header.metadata.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if default is None:
        raise HeaderError(f"{header.path} has no {key}: its capacity cannot be estimated")
    return default


def _per_layer(header: GgufHeader, key: str, layers: int, default: Sequence[int] | None) -> list[int]:
    """A count per layer: some architectures (OpenELM) state one per layer, most one for all."""
    value = header.metadata.get(key)
    if isinstance(value, list):
        return [int(v) for v in value[:layers]]
    if value is None and default is not None:
        return list(default)
    return [_int(header, key)] * layers


def _from_directory(directory: Path) -> ModelShape:
    config = read_config(directory)
    paths = sorted(directory.glob("*.safetensors"))
    if not paths:
        raise HeaderError(f"{directory} has no .safetensors file: only safetensors weights are read")
    files = []
    for path in paths:
        st = read_safetensors(path)
        files.append(WeightsFile(path=str(path), bytes=st.nbytes, quantisation=_mix(st.by_dtype)))
    layers = _config_int(config, directory, "num_hidden_layers")
    heads = _config_int(config, directory, "num_attention_heads")
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or _config_int(config, directory, "hidden_size") // heads)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    archs = config.get("architectures")
    return ModelShape(
        source=str(directory),
        format="safetensors",
        architecture=str(archs[0])
        if isinstance(archs, list) and archs
        else str(config.get("model_type", "")),
        files=tuple(files),
        layers=layers,
        k_per_token=layers * kv_heads * head_dim,
        v_per_token=layers * kv_heads * head_dim,
        dtype_bytes=TORCH_DTYPE_BYTES.get(dtype, 2),
        context_length=int(config.get("max_position_embeddings") or 0),
    )


def _config_int(config: dict[str, Any], directory: Path, key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or value <= 0:
        raise HeaderError(f"{directory}/config.json has no {key}: its capacity cannot be estimated")
    return value
