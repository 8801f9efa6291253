#!/usr/bin/env python3
"""Write a tiny random-weight Llama as a Hugging Face directory, for tests that run a real vLLM.

The weights are noise, so the text is nonsense, but everything around it is
real: vLLM reads config.json, loads model.safetensors, tokenizes with a
byte-level BPE tokenizer (tokenizer.json, trained here on a few sentences),
applies the chat template and streams tokens with usage. Two layers, 128
wide, 0.7 MB: a 2-core CPU serves it.

    python scripts/make_tiny_hf_model.py --out /tmp/tiny-llama
    python scripts/make_tiny_hf_model.py --out /tmp/bad-heads --heads 4 --head-dim 16

The default shape (2 query heads and 1 KV head of 64) is one vLLM's CPU
attention runs; `--heads 4 --head-dim 16` is one it loads, reports healthy,
then dies on at the first request ("Unsupported CPU attention configuration").
`--architecture` names another class in config.json, for an engine that
does not know it.

Needs only numpy (a dev extra): the safetensors file and the tokenizer are
written by hand, so neither transformers nor torch is needed to make one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import struct
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

# A template any jinja engine renders: vLLM refuses a chat request whose
# tokenizer carries no template (transformers no longer has a default one).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# What the tokenizer learns its merges from: enough pairs to fill VOCAB.
CORPUS = """\
The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.
Hello there, how are you today? I am fine, thank you, and how are you?
A language model reads tokens and writes tokens, one after another, until it stops.
The gateway sends each request to a replica that is ready and counts the tokens it used.
Engines start, load their weights, answer their health checks, and serve the requests.
<|system|> <|user|> <|assistant|> What is the capital of France? Paris is the capital.
Numbers like 1, 2, 3, 10, 42, 100 and 2048 appear in text as often as words do.
Streaming answers arrive in small chunks, and the last chunk carries the usage of the call.
"""

BOS, EOS = "<s>", "</s>"
VOCAB = 512
HIDDEN = 128
FEED_FORWARD = 256
LAYERS = 2
CONTEXT = 2048

# GPT-2's pre-tokenizer pattern, which tokenizers' ByteLevel applies (use_regex).
_WORDS = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255, as tokenizers' ByteLevel maps them."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _train_bpe(text: str, size: int) -> tuple[dict[str, int], list[str]]:
    """A byte-level BPE vocabulary of at most size tokens (the two specials first) and its merges."""
    to_char = _byte_chars()
    vocab = {BOS: 0, EOS: 1}
    for char in to_char:
        vocab[char] = len(vocab)
    words = Counter(tuple(to_char[b] for b in w.encode()) for w in _WORDS.findall(text))
    merges: list[str] = []
    while len(vocab) < size:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        # The most frequent pair, ties broken by the pair itself: the same file from the same text.
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        vocab[merged] = len(vocab)
        words = Counter({_merge(word, best, merged): count for word, count in words.items()})
    return vocab, merges


def _merge(word: tuple[str, ...], pair: tuple[str, str], merged: str) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict[str, Any]:
    specials = [
        {
            "id": vocab[token],
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for token in (BOS, EOS)
    ]
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {"type": "ByteLevel", **byte_level},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _bfloat16(values: np.ndarray[Any, np.dtype[np.float32]]) -> np.ndarray[Any, np.dtype[np.uint16]]:
    """values as bfloat16 bits (rounded to nearest even); numpy has no bfloat16 of its own."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray[Any, np.dtype[np.uint16]]]) -> None:
    """The safetensors format: an 8-byte header length, a JSON header, then the raw tensors in order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        size = tensors[name].nbytes
        header[name] = {
            "dtype": "BF16",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    # The data must start 8-byte aligned; the format pads the header with spaces for it.
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name in sorted(tensors):
            f.write(tensors[name].astype("<u2").tobytes())


def write_tiny_hf_model(
    out: Path,
    *,
    heads: int = 2,
    head_dim: int = 64,
    kv_heads: int = 1,
    architecture: str = "LlamaForCausalLM",
    seed: int = 0,
) -> Path:
    """Write the model directory out and return it. Deterministic for given arguments."""
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads evenly")
    vocab, merges = _train_bpe(CORPUS, VOCAB)
    rng = np.random.default_rng(seed)

    def weight(rows: int, columns: int) -> np.ndarray[Any, np.dtype[np.uint16]]:
        # Small values keep the activations finite through the norms.
        return _bfloat16(rng.standard_normal((rows, columns), dtype=np.float32) * 0.02)

    def norm() -> np.ndarray[Any, np.dtype[np.uint16]]:
        return _bfloat16(np.ones(HIDDEN, dtype=np.float32))

    # Rows are outputs, columns inputs (torch.nn.Linear's layout). The output layer is tied to the
    # embedding (tie_word_embeddings), so there is no lm_head.weight.
    tensors = {"model.embed_tokens.weight": weight(len(vocab), HIDDEN), "model.norm.weight": norm()}
    for layer in range(LAYERS):
        block = f"model.layers.{layer}"
        tensors[f"{block}.input_layernorm.weight"] = norm()
        tensors[f"{block}.post_attention_layernorm.weight"] = norm()
        tensors[f"{block}.self_attn.q_proj.weight"] = weight(heads * head_dim, HIDDEN)
        tensors[f"{block}.self_attn.k_proj.weight"] = weight(kv_heads * head_dim, HIDDEN)
        tensors[f"{block}.self_attn.v_proj.weight"] = weight(kv_heads * head_dim, HIDDEN)
        tensors[f"{block}.self_attn.o_proj.weight"] = weight(HIDDEN, heads * head_dim)
        tensors[f"{block}.mlp.gate_proj.weight"] = weight(FEED_FORWARD, HIDDEN)
        tensors[f"{block}.mlp.up_proj.weight"] = weight(FEED_FORWARD, HIDDEN)
        tensors[f"{block}.mlp.down_proj.weight"] = weight(HIDDEN, FEED_FORWARD)

    config = {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FEED_FORWARD,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "vocab_size": len(vocab),
        "bos_token_id": vocab[BOS],
        "eos_token_id": vocab[EOS],
        "torch_dtype": "bfloat16",
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": CONTEXT,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": vocab[BOS], "eos_token_id": vocab[EOS]}

    out.mkdir(parents=True, exist_ok=True)
    _write_safetensors(out / "model.safetensors", tensors)
    for name, content in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("tokenizer.json", _tokenizer_json(vocab, merges)),
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS}),
    ):
        (out / name).write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="the directory to write the model into")
    parser.add_argument("--heads", type=int, default=2, help="query heads (default 2)")
    parser.add_argument("--head-dim", type=int, default=64, help="the width of each head (default 64)")
    parser.add_argument("--kv-heads", type=int, default=1, help="key/value heads (default 1)")
    parser.add_argument(
        "--architecture",
        default="LlamaForCausalLM",
        help="the class config.json names (default LlamaForCausalLM)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for flag in ("heads", "head_dim", "kv_heads"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    try:
        write_tiny_hf_model(
            args.out,
            heads=args.heads,
            head_dim=args.head_dim,
            kv_heads=args.kv_heads,
            architecture=args.architecture,
            seed=args.seed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
