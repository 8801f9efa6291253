"""A GGUF file's header: its metadata and its tensors' names, types and shapes, never their data.

Read here rather than with the `gguf` package: gguf's reader memory-maps the
whole file and builds a numpy view of every tensor, and brings numpy into the
product, to answer what the first few megabytes of the file say. The format is
small and documented (ggml's docs/gguf.md): magic, version, counts, key-value
metadata, tensor infos. Versions 2 and 3 are read; version 1 (32-bit counts,
2023) is refused in words.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import BinaryIO

import attrs

from llmgw.errors import LlmgwError

MAGIC = b"GGUF"
# ggml type id -> (name, elements per block, bytes per block); tests hold it to gguf's own table.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# Metadata value types: id -> struct format of a scalar; 8 is a string, 9 an array.
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
# An array longer than this (a vocabulary's tokens) is skipped over, its length kept.
_KEEP_ARRAY = 4096
# Past these a header is damage, not a model: a count read from noise would loop for hours.
_MAX_COUNT = 1 << 24
_MAX_STRING = 1 << 26
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class HeaderError(LlmgwError):
    """A file whose header cannot be read as a model's: missing, truncated, not GGUF, damaged."""


@attrs.frozen
class Tensor:
    name: str
    type_name: str
    shape: tuple[int, ...]
    nbytes: int


@attrs.frozen
class GgufHeader:
    path: Path
    version: int
    metadata: dict[str, object]
    tensors: tuple[Tensor, ...]

    @property
    def weights_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def read_header(path: Path) -> GgufHeader:
    """The header of one GGUF file; HeaderError says in words why it is not one."""
    try:
        with path.open("rb") as stream:
            return _Reader(stream, path).header()
    except FileNotFoundError:
        raise HeaderError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise HeaderError(f"{path} is a directory, not a GGUF file") from None
    except OSError as exc:
        raise HeaderError(f"{path} cannot be read: {exc.strerror or exc}") from None


def split_parts(path: Path) -> list[Path]:
    """Every part of a split model (NAME-00001-of-00003.gguf) given any one part; else [path]."""
    match = _SPLIT.match(path.name)
    if match is None:
        return [path]
    count = int(match["count"])
    return [path.with_name(f"{match['stem']}-{no:05d}-of-{count:05d}.gguf") for no in range(1, count + 1)]


class _Reader:
    def __init__(self, stream: BinaryIO, path: Path) -> None:
        self._stream = stream
        self._path = path

    def _take(self, n: int) -> bytes:
        data = self._stream.read(n)
        if len(data) != n:
            raise HeaderError(
                f"{self._path} ends inside its GGUF header (at byte {self._stream.tell()}): "
                "the file is truncated, or still downloading"
            )
        return data

    def _scalar(self, fmt: str) -> int | float | bool:
        value: int | float | bool = struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]
        return value

    def _count(self, what: str) -> int:
        n = int(self._scalar("<Q"))
        if n > _MAX_COUNT:
            raise HeaderError(f"{self._path} says it has {n} {what}: its GGUF header is damaged")
        return n

    def _string(self) -> str:
        n = int(self._scalar("<Q"))
        if n > _MAX_STRING:
            raise HeaderError(f"{self._path} has a {n}-byte string in its header: the header is damaged")
        return self._take(n).decode("utf-8", errors="replace")

    def _value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self._scalar(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            element, n = int(self._scalar("<I")), self._count("array elements")
            values = [self._value(element) for _ in range(n)]
            return values if n <= _KEEP_ARRAY else n
        raise HeaderError(f"{self._path} has a metadata value of unknown type {kind}: the header is damaged")

    def header(self) -> GgufHeader:
        magic = self._stream.read(4)
        if magic != MAGIC:
            if not magic:
                raise HeaderError(f"{self._path} is empty")
            raise HeaderError(f"{self._path} is not a GGUF file (it starts {magic!r}, not b'GGUF')")
        version = int(self._scalar("<I"))
        if version not in (2, 3):
            raise HeaderError(f"{self._path} is GGUF version {version}; versions 2 and 3 are read")
        n_tensors, n_kv = self._count("tensors"), self._count("metadata keys")
        metadata: dict[str, object] = {}
        for _ in range(n_kv):
            key = self._string()
            metadata[key] = self._value(int(self._scalar("<I")))
        tensors = tuple(self._tensor() for _ in range(n_tensors))
        return GgufHeader(path=self._path, version=version, metadata=metadata, tensors=tensors)

    def _tensor(self) -> Tensor:
        name = self._string()
        dims = int(self._scalar("<I"))
        if dims > 8:
            raise HeaderError(f"{self._path}: tensor {name} has {dims} dimensions: the header is damaged")
        shape = tuple(int(self._scalar("<Q")) for _ in range(dims))
        type_id = int(self._scalar("<I"))
        self._scalar("<Q")  # its offset in the data section: the data is never read
        known = GGML_TYPES.get(type_id)
        if known is None:
            raise HeaderError(
                f"{self._path}: tensor {name} is of ggml type {type_id}, which this llmgw does not know"
            )
        type_name, block, size = known
        elements = 1
        for d in shape:
            elements *= d
        return Tensor(name=name, type_name=type_name, shape=shape, nbytes=elements // block * size)
