"""A download in a partial file: what was written before, how long the whole is, each chunk kept.

Shared by the agent's weights cache and the mirror's fetches, which both resume an interrupted
download from the bytes on disk and hash as they write.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import aiohttp

_READ = 8 << 20


def total_size(response: aiohttp.ClientResponse, offset: int) -> int | None:
    """The whole file's size, from Content-Range on a resumed answer or Content-Length on a whole one."""
    if response.status == 206:
        whole = response.headers.get("Content-Range", "").rpartition("/")[2]
        if whole.isdigit():
            return int(whole)
    if response.content_length is not None:
        return offset + response.content_length if response.status == 206 else response.content_length
    return None


def write(fh: IO[bytes], hasher: Any, chunk: bytes) -> None:
    """Keep chunk and hash it (blocking: in a thread)."""
    fh.write(chunk)
    hasher.update(chunk)


def hash_prefix(path: Path, hasher: Any) -> int:
    """Feed the file at path (what an earlier try wrote) to hasher; its length, 0 when there is none.

    Blocking: in a thread."""
    try:
        with path.open("rb") as fh:
            size = 0
            while block := fh.read(_READ):
                hasher.update(block)
                size += len(block)
            return size
    except FileNotFoundError:
        return 0


def size(path: Path) -> int:
    """The file's size; 0 when there is none (blocking: in a thread)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
