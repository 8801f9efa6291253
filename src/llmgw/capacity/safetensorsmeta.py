"""A Hugging Face directory's shape: config.json, and each .safetensors file's header, never its data.

A safetensors file starts with an 8-byte little-endian length and that many
bytes of JSON: every tensor's dtype, shape and offsets. That is all the weight
bytes are counted from.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import attrs

from llmgw.capacity.ggufmeta import HeaderError

# safetensors dtype -> bytes per element.
DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F4": 0.5,
}
# config.json's torch_dtype -> bytes per element, for an engine whose KV cache takes the model's dtype.
TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# Past this a header length is damage (real ones are kilobytes to a few megabytes).
_MAX_HEADER = 100 << 20


@attrs.frozen
class SafetensorsFile:
    path: Path
    # Bytes per dtype of its tensors: {"BF16": 1234}.
    by_dtype: dict[str, int]

    @property
    def nbytes(self) -> int:
        return sum(self.by_dtype.values())


def read_safetensors(path: Path) -> SafetensorsFile:
    """One file's header, as bytes per dtype; HeaderError says why it cannot be read."""
    try:
        with path.open("rb") as stream:
            head = stream.read(8)
            if len(head) < 8:
                raise HeaderError(f"{path} is shorter than a safetensors header's length (8 bytes)")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER:
                raise HeaderError(f"{path} says its header is {length} bytes: it is not a safetensors file")
            text = stream.read(length)
    except FileNotFoundError:
        raise HeaderError(f"{path} does not exist") from None
    except OSError as exc:
        raise HeaderError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if len(text) < length:
        raise HeaderError(f"{path} ends inside its safetensors header: it is truncated, or still downloading")
    try:
        header = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise HeaderError(f"{path}'s safetensors header is not JSON: the file is damaged") from None
    by_dtype: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info.get("dtype"), info.get("shape")
        if dtype not in DTYPE_BYTES or not isinstance(shape, list):
            raise HeaderError(f"{path}: tensor {name} has dtype {dtype!r}, which this llmgw does not know")
        elements = 1
        for d in shape:
            elements *= int(d)
        by_dtype[dtype] = by_dtype.get(dtype, 0) + int(elements * DTYPE_BYTES[dtype])
    return SafetensorsFile(path=path, by_dtype=by_dtype)


def read_config(directory: Path) -> dict[str, Any]:
    """config.json, its text model's part where the model has several (a vision model's text_config)."""
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeaderError(
            f"{directory} has no config.json: it is not a Hugging Face model directory"
        ) from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise HeaderError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise HeaderError(f"{path} is not a JSON object")
    text = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text, dict):
        return {**config, **text}
    return config
