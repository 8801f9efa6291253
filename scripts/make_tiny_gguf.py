#!/usr/bin/env python3
"""Write a tiny random-weight llama model as GGUF, for tests that run a real llama-server.

The weights are noise, so the text is nonsense, but everything around it is
real: llama.cpp loads the file, tokenizes with a real SentencePiece vocabulary
(copied from llama.cpp's own models/ggml-vocab-llama-spm.gguf), applies the
chat template and streams tokens with usage. Two layers, 64 wide: about 5 MB,
and a CPU answers in milliseconds.

    python scripts/make_tiny_gguf.py --vocab ~/.cache/llmgw/llama-server/11434/ggml-vocab-llama-spm.gguf \
        --out /tmp/tiny.gguf

Needs the `gguf` package (and numpy, which it brings); both are dev extras only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np

# A template any jinja engine renders: llama-server refuses a chat request
# whose model carries no template it can apply.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '</s>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

EMBEDDING = 64
LAYERS = 2
HEADS = 4
FEED_FORWARD = 128
CONTEXT = 2048


def _tokenizer_fields(vocab: Path) -> dict[str, tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    """The tokenizer.* keys of vocab, each as (value, type, element type of an array)."""
    reader = gguf.GGUFReader(vocab)
    fields: dict[str, tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]] = {}
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        element = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        fields[name] = (field.contents(), kind, element)
    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError(f"{vocab} has no tokenizer.ggml.tokens: it is not a llama.cpp vocabulary file")
    return fields


def write_tiny_gguf(
    out: Path, vocab: Path, *, name: str = "tiny-llama", seed: int = 0, context: int = CONTEXT
) -> Path:
    """Write the model to out and return out. Deterministic for a given seed."""
    tokenizer = _tokenizer_fields(vocab)
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"][0])
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray[Any, np.dtype[np.float16]]:
        # Small values keep the activations finite through the norms; f16
        # halves the file without asking anything unusual of the CPU backend.
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    def norm() -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.ones(EMBEDDING, dtype=np.float32)

    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name(name)
    writer.add_context_length(context)
    writer.add_embedding_length(EMBEDDING)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBEDDING // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, (value, kind, element) in tokenizer.items():
        writer.add_key_value(key, value, kind, sub_type=element)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are ggml's dimensions reversed: (rows, columns) = (out, in).
    # No output.weight: llama.cpp then ties the output to token_embd.
    writer.add_tensor("token_embd.weight", weight(n_vocab, EMBEDDING))
    writer.add_tensor("output_norm.weight", norm())
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", norm())
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{part}.weight", weight(EMBEDDING, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_norm.weight", norm())
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(FEED_FORWARD, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(FEED_FORWARD, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(EMBEDDING, FEED_FORWARD))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--vocab", type=Path, required=True, help="llama.cpp's models/ggml-vocab-llama-spm.gguf"
    )
    parser.add_argument("--out", type=Path, required=True, help="where to write the model")
    parser.add_argument("--name", default="tiny-llama", help="general.name in the file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--context",
        type=int,
        default=CONTEXT,
        help=f"the context length it was trained on, the most llama-server gives a slot (default {CONTEXT})",
    )
    args = parser.parse_args(argv)
    if not args.vocab.is_file():
        parser.error(
            f"the vocabulary {args.vocab} does not exist "
            "(scripts/build-llama-server.sh leaves one in its cache)"
        )
    write_tiny_gguf(args.out, args.vocab, name=args.name, seed=args.seed, context=args.context)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
