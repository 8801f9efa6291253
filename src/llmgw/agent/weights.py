"""The weights cache: a model's files fetched once per node, resumed when interrupted, never half-present.

A source is the URL of one file, or of a directory when it ends in "/". A
directory is listed by asking for its URL: the answer is JSON,

    {"files": [{"path": "config.json", "size": 1234},
               {"path": "model-00001-of-00002.safetensors", "size": 4100000000}]}

which is what the mirror role serves (roles/mirror.py); `size` is optional.

Each source gets its own directory under the cache, named after the URL. A
copy there serves a model only if it matches that model's sha256 pins (the
digests are kept in the marker, so a file is hashed once); pins it does not
match are fetched again into a directory of their own, named after the URL
and the pins, and refused if that copy does not match them either. Files
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
import re
import shutil
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
import attrs
import structlog

from llmgw import download, durable, strictjson
from llmgw.backoff import ExponentialBackoff
from llmgw.download import PART, human_bytes
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

MARKER = ".complete.json"


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


class WeightsCache:
    """Weights on this node's disk, and the downloads that put them there."""

    def __init__(
        self,
        root: Path,
        *,
        attempts: int = 5,
        retry_base_s: float = 1.0,
        session: aiohttp.ClientSession | None = None,
        on_disk_full: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """clock: what a download's progress is told by, every few seconds (download.py)."""
        self.root = root
        self._clock = clock
        # Told when a download fills the disk, so the node's free space is read and sent at once.
        self._on_disk_full = on_disk_full
        # No cap: `attempts` bounds the waits (1 + 2 + 4 + 8 s by default).
        self._retries = download.Retries(attempts, ExponentialBackoff(base_s=retry_base_s))
        self._session = session
        self._own_session = session is None
        # directory name -> the marker's contents (source, files and their sha256), for every copy
        # completely on disk: a source has its plain directory, and one per set of pins that the
        # copy there did not match.
        self._present: dict[str, dict[str, Any]] = {}
        # directory name -> the download in flight, shared by every shard that needs it; its pins and source.
        self._inflight: dict[str, asyncio.Task[Path]] = {}
        self._inflight_pins: dict[str, dict[str, str]] = {}
        self._sources: dict[str, str] = {}
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

    def path_of(self, source: str, sha256: Mapping[str, str] | None = None) -> Path | None:
        """The local path of a copy of source completely on disk that matches sha256's pins; else None."""
        pins = _pins(sha256 or {})
        for name, marker in self._copies(source):
            if _mismatch(marker, pins) is None:
                return self._path(name, marker)
        return None

    def present(self, in_use: Collection[str] = ()) -> list[pb.Weights]:
        """Every copy completely on disk, for the heartbeat; in_use marks those an engine has open."""
        out = []
        for name, marker in sorted(self._present.items()):
            source = marker["source"]
            files = marker["files"]
            out.append(
                pb.Weights(
                    source=source,
                    path=str(self._path(name, marker)),
                    size_bytes=sum(int(f["size"]) for f in files),
                    sha256=files[0].get("sha256", "") if len(files) == 1 else "",
                    in_use=source in in_use or any(self._sources.get(n) == source for n in self._inflight),
                )
            )
        return out

    async def fetch(self, source: str, sha256: Mapping[str, str], progress: Progress | None = None) -> Path:
        """The local path of source, downloading what is missing first; WeightsError when it cannot be had.

        A copy already on disk is used only if it matches these pins: another model may name
        the same URL with other pins, or none, and a pin skipped because the URL was cached
        let a model with a wrong pin be served whatever file was there.
        """
        pins = _pins(sha256)
        while True:
            have = await self._copy_for(source, pins)
            if have is not None:
                return have
            # The first copy of a source goes to its plain directory; pins the copy there does not
            # match get a directory of their own, so neither model's file replaces the other's.
            primary = cache_key(source)
            name = primary if primary not in self._present else _pinned_key(source, pins)
            theirs = name in self._inflight and self._inflight_pins.get(name) != pins
            if name != primary and name not in self._inflight:
                log.info(
                    "the cached copy of these weights does not match this model's pins; fetching them again",
                    source=source,
                    why=_mismatch(self._present[primary], pins),
                    path=str(self.root / name),
                )
            try:
                path = await self._join(name, source, pins, progress)
            except WeightsError:
                if theirs:
                    # Another model's download, with other pins, failed (on its own pin, say): that
                    # says nothing of these pins, which are tried on their own next.
                    continue
                raise
            if not theirs:
                return path
            # Another model's download finished: whether its copy fits these pins is checked on the
            # next turn, never assumed.

    async def remove(self, sources: Collection[str], in_use: Collection[str]) -> tuple[list[str], list[str]]:
        """Delete every copy of the sources no engine has open; (removed, kept with the reason)."""
        removed: list[str] = []
        kept: list[str] = []
        for source in dict.fromkeys(sources):
            if source in in_use or any(self._sources.get(n) == source for n in self._inflight):
                kept.append(f"{source} (an engine on this node uses it)")
                continue
            for name in await asyncio.to_thread(_directories_of, self.root, source):
                directory = self.root / name
                self._present.pop(name, None)
                await asyncio.to_thread(shutil.rmtree, directory, True)
                log.info("removed weights no model uses", source=source, path=str(directory))
            removed.append(source)
        return removed, kept

    # --- the copies on disk ---------------------------------------------------------------

    def _copies(self, source: str) -> list[tuple[str, dict[str, Any]]]:
        """(directory name, marker) of every complete copy of source, its plain directory first."""
        primary = cache_key(source)
        found = [(n, m) for n, m in self._present.items() if m["source"] == source]
        return sorted(found, key=lambda item: (item[0] != primary, item[0]))

    def _path(self, name: str, marker: dict[str, Any]) -> Path:
        base = self.root / name
        return base if marker["source"].endswith("/") else base / marker["files"][0]["path"]

    async def _copy_for(self, source: str, pins: dict[str, str]) -> Path | None:
        """A complete copy of source that matches pins; a file is hashed at most once, ever."""
        for name, marker in self._copies(source):
            if pins and any("sha256" not in f for f in marker["files"]):
                # A marker that kept no digest: hash now, once, and keep the digest beside the file.
                marker = await asyncio.to_thread(_hash_marker, self.root / name, marker)
                self._present[name] = marker
            if _mismatch(marker, pins) is None:
                return self._path(name, marker)
        return None

    async def _join(self, name: str, source: str, pins: dict[str, str], progress: Progress | None) -> Path:
        """Wait for the download into directory name, starting one for pins when none is in flight."""
        listeners = self._listeners.setdefault(name, [])
        if progress is not None:
            listeners.append(progress)
        self._waiters[name] = self._waiters.get(name, 0) + 1
        task = self._inflight.get(name)
        if task is None:
            # One download per directory: a second shard of the same model waits on the first's.
            task = asyncio.create_task(self._download(name, source, pins), name=f"weights {source}")
            self._inflight[name] = task
            self._inflight_pins[name] = pins
            self._sources[name] = source
            task.add_done_callback(lambda _: self._finished(name))
        try:
            # Shielded: a shard stopped while waiting must not cancel the download another waits on.
            return await asyncio.shield(task)
        finally:
            if progress is not None and progress in listeners:
                listeners.remove(progress)
            waiting = self._waiters.get(name, 1) - 1
            if waiting > 0:
                self._waiters[name] = waiting
            else:
                self._waiters.pop(name, None)
            if not waiting and not task.done():
                # Nobody wants it any more; the .part file stays for the next try to resume.
                task.cancel()

    # --- one download ---------------------------------------------------------------------

    def _finished(self, name: str) -> None:
        self._inflight.pop(name, None)
        self._inflight_pins.pop(name, None)
        self._sources.pop(name, None)
        self._listeners.pop(name, None)

    def _report(self, name: str, text: str) -> None:
        for listener in list(self._listeners.get(name, ())):
            listener(text)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No total timeout: a 40 GB file takes as long as it takes. A stalled one is caught by sock_read.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=60))
        return self._session

    async def _download(self, name: str, source: str, pins: dict[str, str]) -> Path:
        base = self.root / name
        await asyncio.to_thread(base.mkdir, parents=True, exist_ok=True)
        files = await self._list(source)
        _check_pins_name_files(source, files, pins)
        total = sum(f.size for f in files if f.size is not None) if all(f.size for f in files) else None
        if total is not None:
            await self._check_space(base, files, total)
        done_before = 0
        recorded = []
        for number, f in enumerate(files, 1):
            label = (
                f.path
                if len(files) == 1
                else f"{PurePosixPath(source.rstrip('/')).name}/ ({number} of {len(files)} files)"
            )
            part = base / (f.path + PART)
            pin = _pin_for(f.path, pins, single=len(files) == 1)
            try:
                got = await self._fetch_file(name, f, base, label, done_before, total, pin)
            except download.DiskFull as full:
                # A partial file on a full disk is what keeps it full: every other write there (the
                # engine's logs, the next download) fails until someone finds and removes it.
                await asyncio.to_thread(_unlink, part)
                later = [full.size, *(g.size for g in files[number:])]
                raise await self._no_space(base, f.path, later) from None
            await asyncio.to_thread(durable.move_into_place, part, base / f.path)
            recorded.append({"path": f.path, "size": got.size, "sha256": got.sha256})
            done_before += got.size
        marker = {"source": source, "files": recorded}
        await asyncio.to_thread(_write_marker, base, marker)
        self._present[name] = marker
        self._report(
            name, f"downloaded {PurePosixPath(source.rstrip('/')).name}: {human_bytes(done_before, None)}"
        )
        log.info("weights downloaded", source=source, bytes=done_before, path=str(base))
        return self._path(name, marker)

    async def _list(self, source: str) -> list[_File]:
        if not source.endswith("/"):
            name = PurePosixPath(urllib.parse.urlsplit(source).path).name
            # ".." would be the cache's own parent: the download would be renamed over a directory.
            if name in ("", ".."):
                raise WeightsError(f"{source} names no file; a directory's URL must end in '/'")
            return [_File(path=name, url=source, size=None)]
        label = f"weights {PurePosixPath(urllib.parse.urlsplit(source).path).name}/"
        try:
            async with self._http().get(source) as response:
                if response.status != 200:
                    raise WeightsError(f"{label}: HTTP {response.status} at {source}")
                listing = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise WeightsError(f"{label}: listing {source} failed: {exc or type(exc).__name__}") from None
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
            label = files[0].path if len(files) == 1 else f"{len(files)} files"
            mount = await asyncio.to_thread(_mount_point, base)
            raise WeightsError(
                f"weights {label}: no space left on {mount} (needs {human_bytes(total - have - free, None)} "
                f"more, {human_bytes(free, None)} free); "
                "`llmgw ctl weights collect` removes weights no model uses"
            )

    async def _no_space(self, base: Path, label: str, sizes: list[int | None]) -> WeightsError:
        """The error for a download the disk filled up under, with the free space as it is now."""
        if self._on_disk_full is not None:
            # The node's free space changed a lot and at once: the control plane hears it now, not
            # at the next registration.
            self._on_disk_full()
        free = (await asyncio.to_thread(shutil.disk_usage, base)).free
        mount = await asyncio.to_thread(_mount_point, base)
        hint = "`llmgw ctl weights collect` removes weights no model uses"
        if any(size is None for size in sizes):
            return WeightsError(
                f"weights {label}: no space left on {mount} ({human_bytes(free, None)} free, less than "
                f"the download needs); the partial file was removed; {hint}"
            )
        more = sum(size for size in sizes if size is not None) - free
        needs = f"needs {human_bytes(more, None)} more" if more > 0 else f"{human_bytes(free, None)} free now"
        return WeightsError(
            f"weights {label}: no space left on {mount} ({needs}); the partial file was removed; {hint}"
        )

    async def _fetch_file(
        self,
        name: str,
        f: _File,
        base: Path,
        label: str,
        done_before: int,
        total: int | None,
        pin: str | None,
    ) -> download.Downloaded:
        """Download one file to its .part, resuming, checked against its pin and its listed size."""

        def told(done: int, size: int | None) -> None:
            whole = done_before + done, total if total is not None else size
            self._report(name, f"downloading {label}: {human_bytes(*whole)}")

        def received(n: int) -> None:
            self.downloaded_bytes += n

        try:
            return await download.fetch(
                self._http(),
                f.url,
                base / (f.path + PART),
                retries=self._retries,
                size=f.size,
                sha256=pin,
                progress=told,
                received=received,
                clock=self._clock,
            )
        except download.Mismatch as exc:
            if exc.what == "sha256":
                raise WeightsError(
                    f"weights {f.path}: sha256 does not match the pin "
                    f"(expected {exc.expected}, got {exc.got}); the file downloaded from {f.url} was removed"
                ) from None
            raise WeightsError(
                f"weights {f.path}: {exc.got} bytes where the listing says {exc.expected}; "
                f"the file downloaded from {f.url} was removed"
            ) from None
        except download.DownloadError as exc:
            raise WeightsError(f"weights {f.path}: {exc}") from None


def _pins(sha256: Mapping[str, str]) -> dict[str, str]:
    """A model's pins as compared: keys without a leading "/", digests bare and lower case."""
    return {key.lstrip("/"): value.removeprefix("sha256:").strip().lower() for key, value in sha256.items()}


def _pinned_key(source: str, pins: Mapping[str, str]) -> str:
    """The directory of a copy of source fetched for pins the plain directory's copy does not match."""
    digest = hashlib.sha256(strictjson.dumps(sorted(pins.items())).encode()).hexdigest()[:12]
    return f"{cache_key(source)}-pin-{digest}"


def _pin_for(path: str, pins: Mapping[str, str], *, single: bool) -> str | None:
    """The pin for the file at path: by its path, its name, or "" for a source of one file."""
    return pins.get(path) or pins.get(PurePosixPath(path).name) or (pins.get("") if single else None)


def _pin_names(key: str, paths: Collection[str], *, single: bool) -> bool:
    return (key == "" and single) or any(key in (p, PurePosixPath(p).name) for p in paths)


def _check_pins_name_files(source: str, files: list[_File], pins: Mapping[str, str]) -> None:
    # A pin naming no file (a typo, a file renamed upstream) would otherwise pin nothing at all.
    paths = [f.path for f in files]
    for key in pins:
        if not _pin_names(key, paths, single=len(files) == 1):
            has = ", ".join(paths[:5]) + (", …" if len(paths) > 5 else "")
            raise WeightsError(
                f"weights {PurePosixPath(source.rstrip('/')).name}: the sha256 pin for {key!r} names no "
                f"file of {source} (it has: {has})"
            )


def _mismatch(marker: Mapping[str, Any], pins: Mapping[str, str]) -> str | None:
    """Why a copy on disk does not satisfy pins, or None when it does (no pins: any copy does)."""
    if not pins:
        return None
    files = marker.get("files") or []
    paths = [str(f["path"]) for f in files]
    single = len(files) == 1
    for key in pins:
        if not _pin_names(key, paths, single=single):
            return f"the pin for {key!r} names no file of it"
    for f in files:
        pin = _pin_for(str(f["path"]), pins, single=single)
        if pin is not None and pin != f.get("sha256"):
            return (
                f"weights {f['path']}: sha256 does not match the pin (expected {pin}, got {f.get('sha256')})"
            )
    return None


def _hash_marker(base: Path, marker: dict[str, Any]) -> dict[str, Any]:
    """marker with every file's sha256, hashing those it lacks, written back so it is done once."""
    files = []
    for f in marker["files"]:
        if "sha256" not in f:
            hasher = hashlib.sha256()
            download.hash_prefix(base / f["path"], hasher)
            f = {**f, "sha256": hasher.hexdigest()}
        files.append(f)
    updated = {**marker, "files": files}
    _write_marker(base, updated)
    return updated


def _directories_of(root: Path, source: str) -> list[str]:
    """Every directory of source under root, complete or not: its plain one and its pinned ones."""
    primary = cache_key(source)
    return [primary, *sorted(p.name for p in root.glob(f"{primary}-pin-*") if p.is_dir())]


def _mount_point(path: Path) -> Path:
    """The mount point of the filesystem path is on: what an operator knows the disk by."""
    path = path.resolve()
    while not path.is_mount() and path != path.parent:
        path = path.parent
    return path


def _part_bytes(base: Path, paths: list[str]) -> int:
    return sum(download.size_on_disk(base / p) or download.size_on_disk(base / (p + PART)) for p in paths)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _write_marker(base: Path, marker: dict[str, Any]) -> None:
    # The rename is what makes the source present: a crash before it leaves no marker at all.
    durable.write_atomically(base / MARKER, strictjson.dumps(marker, indent=1))


def _scan(root: Path) -> dict[str, dict[str, Any]]:
    """directory name -> marker, for every copy completely on disk."""
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
        name = marker_path.parent.name
        if name != cache_key(source) and not re.fullmatch(
            re.escape(cache_key(source)) + r"-pin-[0-9a-f]{12}", name
        ):
            continue
        # A file removed by hand since makes the source absent, not present and broken.
        if all((marker_path.parent / f["path"]).is_file() for f in files):
            present[name] = marker
    return present
