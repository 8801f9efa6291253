"""Small model files with the headers of real ones, written for the capacity tests.

Quantised tensors are written as their raw blocks (gguf's `raw_dtype`): the
bytes are noise, which nothing here reads, and their header is the one
llama.cpp's own quantiser writes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def _tensor(writer: gguf.GGUFWriter, name: str, rows: int, cols: int, qtype: Q) -> None:
    block, size = gguf.constants.GGML_QUANT_SIZES[qtype]
    if qtype in (Q.F32, Q.F16):
        dtype = np.float32 if qtype == Q.F32 else np.float16
        writer.add_tensor(name, np.zeros((rows, cols), dtype=dtype))
        return
    raw = np.zeros((rows, cols // block * size), dtype=np.uint8)
    writer.add_tensor(name, raw, raw_dtype=qtype)


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    layers: int = 2,
    width: int = 256,
    heads: int = 4,
    kv_heads: int = 4,
    vocab: int = 512,
    qtype: Q = Q.F16,
    context: int = 2048,
    split_max_tensors: int = 0,
    tensors: bool = True,
) -> list[Path]:
    """A GGUF model of arch (one file, or parts of at most split_max_tensors tensors); its file(s).

    Without tensors it is what llama.cpp's ggml-vocab-*.gguf are: a model's hyperparameters and
    vocabulary, and no weights.
    """
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    writer.add_context_length(context)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(width * 2)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    # A vocabulary's worth of tokens: the array the reader skips over.
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    if not tensors:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        return [path]
    _tensor(writer, "token_embd.weight", vocab, width, qtype)
    _tensor(writer, "output_norm.weight", 1, width, Q.F32)
    head_dim = width // heads
    for layer in range(layers):
        block = f"blk.{layer}"
        _tensor(writer, f"{block}.attn_norm.weight", 1, width, Q.F32)
        _tensor(writer, f"{block}.attn_q.weight", width, width, qtype)
        _tensor(writer, f"{block}.attn_k.weight", kv_heads * head_dim, width, qtype)
        _tensor(writer, f"{block}.attn_v.weight", kv_heads * head_dim, width, qtype)
        _tensor(writer, f"{block}.attn_output.weight", width, width, qtype)
        _tensor(writer, f"{block}.ffn_up.weight", width * 2, width, qtype)
        _tensor(writer, f"{block}.ffn_down.weight", width, width * 2, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))
    return [path]


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file of zeros: name -> (dtype, shape)."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = int(np.prod(shape)) * sizes[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(offset))


def write_hf_directory(
    directory: Path,
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 2,
    kv_heads: int = 1,
    head_dim: int = 64,
) -> Path:
    """A Hugging Face directory: config.json and two safetensors shards in bf16."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config))
    write_safetensors(directory / "model-00001-of-00002.safetensors", {"embed": ("BF16", [512, hidden])})
    write_safetensors(
        directory / "model-00002-of-00002.safetensors",
        {f"l{i}.q": ("BF16", [hidden, hidden]) for i in range(layers)},
    )
    return directory
