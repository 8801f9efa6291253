"""A model's headers over HTTP: the few bytes `llmgw/capacity/` reads, never the weights.

A GGUF file's header is its first few megabytes (its vocabulary is most of
it), so the first 8 MiB are asked for with a Range request; a directory's
listing (the mirror's `{"files": [{"path": ...}]}`, as agents read it) names
its config.json, fetched whole, and its .safetensors files, of which the
8-byte length and then the JSON header are asked for; a directory of GGUF
files without a config.json (a llama.cpp model on the mirror) gives its one
model's first 8 MiB, every part of a split one. What comes back is laid
out in a local directory as the model's files would be, truncated after their
headers, for capacity/shape.py to read as it reads any model.
"""

from __future__ import annotations

import asyncio
import re
import struct
import urllib.parse
from pathlib import Path, PurePosixPath

import aiohttp

from llmgw.errors import LlmgwError

# Bytes asked of a GGUF file: a header past this (a vocabulary of millions) is not estimated.
GGUF_HEAD = 8 << 20
# Past these, a header or a config is not one.
_MAX_SAFETENSORS_HEADER = 100 << 20
_MAX_CONFIG = 1 << 20
# A split GGUF's parts: NAME-00001-of-00003.gguf.
_PART = re.compile(r"-(\d+)-of-\d+(?=\.gguf$)")


async def fetch_headers(url: str, into: Path) -> Path:
    """The model at url, its headers laid out under into; the path capacity/shape.py reads."""
    async with aiohttp.ClientSession() as session:
        if not url.endswith("/"):
            name = PurePosixPath(urllib.parse.urlsplit(url).path).name or "model.gguf"
            head = await _get(session, url, 0, GGUF_HEAD)
            return await _write(into / name, head)
        listing = await _listing(session, url)
        if "config.json" not in listing and any(path.endswith(".gguf") for path in listing):
            return await _gguf_in(session, url, listing, into)
        for path in listing:
            if path == "config.json":
                await _write(into / path, await _get(session, url + path, None, _MAX_CONFIG))
            elif path.endswith(".safetensors") and "/" not in path:
                file_url = url + path
                length_bytes = await _get(session, file_url, 0, 8)
                if len(length_bytes) < 8:
                    raise LlmgwError(f"{file_url} is shorter than a safetensors header's length")
                (length,) = struct.unpack("<Q", length_bytes[:8])
                if length > _MAX_SAFETENSORS_HEADER:
                    raise LlmgwError(f"{file_url} says its header is {length} bytes: it is not safetensors")
                header = await _get(session, file_url, 8, length)
                await _write(into / path, length_bytes[:8] + header)
        return into


async def _gguf_in(session: aiohttp.ClientSession, url: str, listing: list[str], into: Path) -> Path:
    """The one GGUF model of a directory (every part of a split one), as llama.cpp's adapter picks it."""
    ggufs = sorted(path for path in listing if path.endswith(".gguf"))
    firsts = [path for path in ggufs if _first_part(PurePosixPath(path).name)]
    if len(firsts) != 1:
        raise LlmgwError(
            f"{url} holds {len(firsts)} GGUF models ({', '.join(firsts)}): llama.cpp loads one, so no "
            "estimate is made; fetch only the one to serve into the mirror"
        )
    stem = _PART.sub("", PurePosixPath(firsts[0]).name)
    for path in ggufs:
        if path == firsts[0] or _PART.sub("", PurePosixPath(path).name) == stem:
            target = into / path
            await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
            await _write(target, await _get(session, url + path, 0, GGUF_HEAD))
    return into / firsts[0]


def _first_part(name: str) -> bool:
    part = _PART.search(name)
    return part is None or int(part.group(1)) == 1


async def _listing(session: aiohttp.ClientSession, url: str) -> list[str]:
    try:
        async with session.get(url) as response:
            if response.status != 200:
                raise LlmgwError(f"listing {url} answered HTTP {response.status}")
            listing = await response.json(content_type=None)
        return [str(e["path"]) for e in listing["files"]]
    except (aiohttp.ClientError, ValueError, KeyError, TypeError) as exc:
        raise LlmgwError(f"listing {url} failed: {exc or type(exc).__name__}") from None


async def _get(session: aiohttp.ClientSession, url: str, start: int | None, count: int) -> bytes:
    """Up to count bytes from start (None: the whole file, refused past count).

    A server that ignores Range answers with the whole file: only count bytes of it are read.
    """
    headers = {"Range": f"bytes={start}-{start + count - 1}"} if start is not None else {}
    try:
        async with session.get(url, headers=headers) as response:
            if response.status not in (200, 206):
                raise LlmgwError(f"{url} answered HTTP {response.status}")
            skip = start if start is not None and response.status == 200 else 0
            data = await _read(response, skip + count + (1 if start is None else 0))
    except aiohttp.ClientError as exc:
        raise LlmgwError(f"reading {url} failed: {exc or type(exc).__name__}") from None
    if start is None and len(data) > count:
        raise LlmgwError(f"{url} is over {count} bytes: it is not a model's config.json")
    return data[skip:]


async def _read(response: aiohttp.ClientResponse, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await response.content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def _write(path: Path, data: bytes) -> Path:
    await asyncio.to_thread(path.write_bytes, data)
    return path
