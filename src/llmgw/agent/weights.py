"""The weights cache: a model's files fetched once per node, resumed when interrupted, never half-present.

A source is the URL of one file, or of a directory when it ends in "/". A
directory is listed by asking for its URL: the answer is JSON,

    {"files": [{"path": "config.json", "size": 1234},
               {"path": "model-00001-of-00002.safetensors", "size": 4100000000}]}

which is what the mirror role serves (roles/mirror.py); `size` is optional.

Each source gets its own directory under the cache, named after the URL. Files
are downloaded to `NAME.part` and renamed when complete, and the source counts
as present only once its `.complete.json` marker is written, after every file
is in place and every pinned sha256 has matched. A download cut off midway
keeps its `.part` file, and the next try asks for the rest with a Range
request: a 40 GB file interrupted at 39 GB is not downloaded again.

Everything that touches the disk runs in a thread; hashing a 40 GB file takes
minutes, and the loop carries the node's heartbeats meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import IO, Any

import aiohttp
import attrs
import structlog

from llmgw.backoff import ExponentialBackoff
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb
from llmgw.tasks import to_thread_to_the_end

log = structlog.get_logger(__name__)

MARKER = ".complete.json"
PART = ".part"
_CHUNK = 1 << 20
# Progress is reported this many times over a download at most (and at start and end).
_PROGRESS_STEPS = 100


class WeightsError(LlmgwError):
    """Weights that cannot be fetched; the message says which and why, for the node's operator."""


Progress = Callable[[str], None]


@attrs.frozen
class _File:
    path: str  # relative, posix
    url: str
    size: int | None


def cache_key(source: str) -> str:
    """The directory name of a source: readable, and distinct for every URL."""
    parsed = urllib.parse.urlsplit(source)
    tail = PurePosixPath(parsed.path.rstrip("/")).name or "weights"
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', tail)}-{digest}"


def human_bytes(done: int, total: int | None) -> str:
    """ "1.2 of 4.1 GB": the unit of the total, so both numbers read alike."""
    scale = total if total else done
    unit, div = next(((u, d) for u, d in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)) if scale >= d), ("B", 1))
    if total is None:
        return f"{done / div:.1f} {unit}"
    return f"{done / div:.1f} of {total / div:.1f} {unit}"


class WeightsCache:
    """Weights on this node's disk, and the downloads that put them there."""

    def __init__(
        self,
        root: Path,
        *,
        attempts: int = 5,
        retry_base_s: float = 1.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.root = root
        self._attempts = attempts
        # No cap: `attempts` bounds the waits (1 + 2 + 4 + 8 s by default).
        self._backoff = ExponentialBackoff(base_s=retry_base_s)
        self._session = session
        self._own_session = session is None
        # source -> the marker's contents, for every source completely on disk.
        self._present: dict[str, dict[str, Any]] = {}
        # source -> the download in flight, shared by every shard that needs it.
        self._inflight: dict[str, asyncio.Task[Path]] = {}
        self._listeners: dict[str, list[Progress]] = {}
        self._waiters: dict[str, int] = {}
        # Every byte of weights received since the agent started, for its metrics page.
        self.downloaded_bytes = 0

    async def __aenter__(self) -> WeightsCache:
        await self.load()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def load(self) -> None:
        """Read which sources are complete on disk (their markers); partial ones are not."""
        self._present = await asyncio.to_thread(_scan, self.root)

    async def aclose(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # --- what the supervisor and the report call -----------------------------------------

    def path_of(self, source: str) -> Path | None:
        """The local path of a source completely on disk: the file, or the directory; else None."""
        marker = self._present.get(source)
        if marker is None:
            return None
        base = self.root / cache_key(source)
        return base if source.endswith("/") else base / marker["files"][0]["path"]

    def present(self, in_use: Collection[str] = ()) -> list[pb.Weights]:
        """Every source completely on disk, for the heartbeat; in_use marks those an engine has open."""
        out = []
        for source, marker in sorted(self._present.items()):
            path = self.path_of(source)
            files = marker["files"]
            out.append(
                pb.Weights(
                    source=source,
                    path=str(path),
                    size_bytes=sum(int(f["size"]) for f in files),
                    sha256=files[0]["sha256"] if len(files) == 1 else "",
                    in_use=source in in_use or source in self._inflight,
                )
            )
        return out

    async def fetch(self, source: str, sha256: Mapping[str, str], progress: Progress | None = None) -> Path:
        """The local path of source, downloading what is missing first; WeightsError when it cannot be had."""
        have = self.path_of(source)
        if have is not None:
            return have
        listeners = self._listeners.setdefault(source, [])
        if progress is not None:
            listeners.append(progress)
        self._waiters[source] = self._waiters.get(source, 0) + 1
        task = self._inflight.get(source)
        if task is None:
            # One download per source: a second shard of the same model waits on the first's.
            task = asyncio.create_task(self._download(source, dict(sha256)), name=f"weights {source}")
            self._inflight[source] = task
            task.add_done_callback(lambda _: self._finished(source))
        try:
            # Shielded: a shard stopped while waiting must not cancel the download another waits on.
            return await asyncio.shield(task)
        finally:
            if progress is not None and progress in listeners:
                listeners.remove(progress)
            waiting = self._waiters.get(source, 1) - 1
            if waiting > 0:
                self._waiters[source] = waiting
            else:
                self._waiters.pop(source, None)
            if not waiting and not task.done():
                # Nobody wants it any more; the .part file stays for the next try to resume.
                task.cancel()

    async def remove(self, sources: Collection[str], in_use: Collection[str]) -> tuple[list[str], list[str]]:
        """Delete the sources no engine has open; (removed, kept with the reason)."""
        removed: list[str] = []
        kept: list[str] = []
        for source in sources:
            if source in in_use or source in self._inflight:
                kept.append(f"{source} (an engine on this node uses it)")
                continue
            directory = self.root / cache_key(source)
            self._present.pop(source, None)
            await asyncio.to_thread(shutil.rmtree, directory, True)
            removed.append(source)
            log.info("removed weights no model uses", source=source, path=str(directory))
        return removed, kept

    # --- one download ---------------------------------------------------------------------

    def _finished(self, source: str) -> None:
        self._inflight.pop(source, None)
        self._listeners.pop(source, None)

    def _report(self, source: str, text: str) -> None:
        for listener in list(self._listeners.get(source, ())):
            listener(text)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No total timeout: a 40 GB file takes as long as it takes. A stalled one is caught by sock_read.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=60))
        return self._session

    async def _download(self, source: str, sha256: dict[str, str]) -> Path:
        base = self.root / cache_key(source)
        await asyncio.to_thread(base.mkdir, parents=True, exist_ok=True)
        files = await self._list(source)
        total = sum(f.size for f in files if f.size is not None) if all(f.size for f in files) else None
        if total is not None:
            await self._check_space(base, files, total)
        pins = {_pin_key(k): _pin_value(v) for k, v in sha256.items()}
        done_before = 0
        recorded = []
        for number, f in enumerate(files, 1):
            label = (
                f.path
                if len(files) == 1
                else f"{PurePosixPath(source.rstrip('/')).name}/ ({number} of {len(files)} files)"
            )
            digest, size = await self._fetch_file(source, f, base, label, done_before, total)
            pin = (
                pins.get(f.path)
                or pins.get(PurePosixPath(f.path).name)
                or (pins.get("") if len(files) == 1 else None)
            )
            if pin is not None and pin != digest:
                await asyncio.to_thread(_unlink, base / (f.path + PART))
                raise WeightsError(
                    f"{f.path} from {source} does not match its pinned sha256 "
                    f"(expected {pin}, got {digest}); the download was removed"
                )
            await asyncio.to_thread(os.replace, base / (f.path + PART), base / f.path)
            recorded.append({"path": f.path, "size": size, "sha256": digest})
            done_before += size
        marker = {"source": source, "files": recorded}
        await asyncio.to_thread(_write_marker, base, marker)
        self._present[source] = marker
        self._report(
            source, f"downloaded {PurePosixPath(source.rstrip('/')).name}: {human_bytes(done_before, None)}"
        )
        log.info("weights downloaded", source=source, bytes=done_before, path=str(base))
        path = self.path_of(source)
        assert path is not None
        return path

    async def _list(self, source: str) -> list[_File]:
        if not source.endswith("/"):
            name = PurePosixPath(urllib.parse.urlsplit(source).path).name
            if not name:
                raise WeightsError(f"{source} names no file; a directory's URL must end in '/'")
            return [_File(path=name, url=source, size=None)]
        try:
            async with self._http().get(source) as response:
                if response.status != 200:
                    raise WeightsError(f"listing {source} failed: the server answered {response.status}")
                listing = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise WeightsError(f"listing {source} failed: {exc or type(exc).__name__}") from None
        try:
            entries = listing["files"]
            files = [_File(path=str(e["path"]), url="", size=e.get("size")) for e in entries]
        except (KeyError, TypeError):
            raise WeightsError(
                f'{source} did not answer with a listing ({{"files": [{{"path": ...}}]}}); '
                "serve the directory from the llmgw mirror, or name one file"
            ) from None
        out = []
        for f in files:
            parts = PurePosixPath(f.path).parts
            if not parts or f.path.startswith("/") or ".." in parts or f.path.endswith((PART, MARKER)):
                raise WeightsError(f"{source} lists {f.path!r}, which is not a path inside the directory")
            url = urllib.parse.urljoin(source, urllib.parse.quote(f.path))
            out.append(attrs.evolve(f, url=url))
        if not out:
            raise WeightsError(f"{source} lists no files")
        return out

    async def _check_space(self, base: Path, files: list[_File], total: int) -> None:
        have = await asyncio.to_thread(_part_bytes, base, [f.path for f in files])
        free = (await asyncio.to_thread(shutil.disk_usage, base)).free
        if total - have > free:
            raise WeightsError(
                f"{base} has {human_bytes(free, None)} free and the weights need "
                f"{human_bytes(total - have, None)} more; "
                "`llmgw ctl weights collect` removes weights no model uses"
            )

    async def _fetch_file(
        self, source: str, f: _File, base: Path, label: str, done_before: int, total: int | None
    ) -> tuple[str, int]:
        """Download one file to its .part, resuming; its sha256 and size."""
        part = base / (f.path + PART)
        await asyncio.to_thread(part.parent.mkdir, parents=True, exist_ok=True)
        failures = 0
        while True:
            try:
                return await self._attempt(f, part, label, done_before, total, source)
            except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
                failures += 1
                have = await asyncio.to_thread(_size, part)
                if failures >= self._attempts:
                    raise WeightsError(
                        f"downloading {f.url} failed {failures} times, the last at "
                        f"{human_bytes(have, None)}: {exc or type(exc).__name__}; "
                        "the next try resumes from there"
                    ) from None
                log.warning(
                    "a weights download was interrupted; resuming", url=f.url, at=have, error=str(exc)
                )
                await asyncio.sleep(self._backoff.delay(failures))

    async def _attempt(
        self, f: _File, part: Path, label: str, done_before: int, total: int | None, source: str
    ) -> tuple[str, int]:
        hasher = hashlib.sha256()
        offset = await asyncio.to_thread(_hash_prefix, part, hasher)
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        async with self._http().get(f.url, headers=headers) as response:
            if response.status == 416 and offset:
                # The server has nothing past what we hold; start over rather than trust it is whole.
                await asyncio.to_thread(_unlink, part)
                raise aiohttp.ClientPayloadError(f"{f.url} refused to resume at byte {offset}")
            if response.status not in (200, 206):
                raise WeightsError(f"downloading {f.url} failed: the server answered {response.status}")
            if response.status == 200 and offset:
                # The server ignored the Range: what it sends is the whole file again.
                hasher = hashlib.sha256()
                offset = 0
            size = _total_size(response, offset)
            file_total = total if total is not None else (size if f.size is None else f.size)
            mode = "ab" if offset else "wb"
            fh = await asyncio.to_thread(open, part, mode)
            try:
                written = offset
                step = max((file_total or 0) // _PROGRESS_STEPS, 64 * _CHUNK)
                self._report(source, f"downloading {label}: {human_bytes(done_before + written, file_total)}")
                next_report = written + step
                async for chunk in response.content.iter_chunked(_CHUNK):
                    await to_thread_to_the_end(_write, fh, hasher, chunk)
                    written += len(chunk)
                    self.downloaded_bytes += len(chunk)
                    if written >= next_report:
                        self._report(
                            source, f"downloading {label}: {human_bytes(done_before + written, file_total)}"
                        )
                        next_report = written + step
            finally:
                await to_thread_to_the_end(fh.close)
        if size is not None and written != size:
            raise aiohttp.ClientPayloadError(f"{f.url} ended at byte {written} of {size}")
        return hasher.hexdigest(), written


def _total_size(response: aiohttp.ClientResponse, offset: int) -> int | None:
    """The whole file's size, from Content-Range on a resumed answer or Content-Length on a whole one."""
    if response.status == 206:
        whole = response.headers.get("Content-Range", "").rpartition("/")[2]
        if whole.isdigit():
            return int(whole)
    if response.content_length is not None:
        return offset + response.content_length if response.status == 206 else response.content_length
    return None


def _pin_key(key: str) -> str:
    return key.lstrip("/")


def _pin_value(value: str) -> str:
    return value.removeprefix("sha256:").strip().lower()


def _write(fh: IO[bytes], hasher: Any, chunk: bytes) -> None:
    fh.write(chunk)
    hasher.update(chunk)


def _hash_prefix(part: Path, hasher: Any) -> int:
    """Feed what an earlier try downloaded to hasher; its length (0 when there is none)."""
    try:
        with part.open("rb") as fh:
            size = 0
            while block := fh.read(_CHUNK * 8):
                hasher.update(block)
                size += len(block)
            return size
    except FileNotFoundError:
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _part_bytes(base: Path, paths: list[str]) -> int:
    return sum(_size(base / p) or _size(base / (p + PART)) for p in paths)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _write_marker(base: Path, marker: dict[str, Any]) -> None:
    tmp = base / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=1), encoding="utf-8")
    # The rename is what makes the source present: a crash before it leaves no marker at all.
    os.replace(tmp, base / MARKER)


def _scan(root: Path) -> dict[str, dict[str, Any]]:
    present: dict[str, dict[str, Any]] = {}
    if not root.is_dir():
        return present
    for marker_path in root.glob(f"*/{MARKER}"):
        try:
            marker = json.loads(marker_path.read_text(encoding="utf-8"))
            source = marker["source"]
            files = marker["files"]
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring an unreadable weights marker", path=str(marker_path))
            continue
        if marker_path.parent.name != cache_key(source):
            continue
        # A file removed by hand since makes the source absent, not present and broken.
        if all((marker_path.parent / f["path"]).is_file() for f in files):
            present[source] = marker
    return present
