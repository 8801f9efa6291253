"""One file fetched over HTTP into NAME.part: resumed from the bytes on disk, hashed as written, retried.

The one resumable download in llmgw, for the agent's weights cache and the
mirror's fetches from a hub. Two copies of it had drifted: the mirror knew a
partial file longer than the file and a partial file already whole, the agent
asked the server for bytes past the end of both.

A download cut off midway keeps its `.part` file, and the next try asks for the
rest with a Range request: a 40 GB file interrupted at 39 GB is not downloaded
again. What the server answers decides what the bytes on disk are worth:

- 206: the rest, appended;
- 200 to a Range request: the server ignored it and sends the whole file, which
  replaces the partial one;
- 416: nothing past what we hold. When the server says the file is exactly that
  long, the partial file is whole; otherwise it is no prefix of the file and is
  started over;
- a partial file longer than the size the caller expects is no prefix of the
  file either, and one exactly that long is whole: neither asks the server.

What arrived is checked against the size the server declared (a shortfall is an
interruption, retried with the project's backoff) and against the size and
sha256 the caller expects (a difference is a different file: it is removed).

Everything that touches the disk runs in a thread; hashing a 40 GB partial file
takes minutes, and the loop carries heartbeats and requests meanwhile.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import aiohttp
import attrs
import structlog
from multidict import CIMultiDictProxy

from llmgw.backoff import ExponentialBackoff
from llmgw.errors import LlmgwError
from llmgw.tasks import to_thread_to_the_end

log = structlog.get_logger(__name__)

PART = ".part"
_CHUNK = 1 << 20
_READ = 8 << 20
# Progress is told this many times over a file (and at its start), and at least this often while bytes
# arrive: by bytes alone, a file under 64 MiB read "0.0 of 400.0 KB" until it was whole, and a large one
# on a slow link moved once per 64 MiB.
_PROGRESS_STEPS = 100
PROGRESS_EVERY_S = 2.0

# (bytes of the file on disk, the file's whole size when known), at the start and as bytes arrive.
Progress = Callable[[int, int | None], None]


def human_bytes(done: int, total: int | None) -> str:
    """ "1.2 of 4.1 GB": the unit of the total, so both numbers read alike."""
    scale = total if total else done
    unit, div = next(((u, d) for u, d in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)) if scale >= d), ("B", 1))
    if total is None:
        return f"{done / div:.1f} {unit}"
    return f"{done / div:.1f} of {total / div:.1f} {unit}"


class DownloadError(LlmgwError):
    """A file that could not be had; the caller puts its own name for the file in front."""


class Interrupted(DownloadError):
    """Every try was cut off; the partial file stays for the next one to resume."""

    def __init__(self, url: str, failures: int, have: int, size: int | None, cause: str) -> None:
        super().__init__(
            f"downloading {url} failed {failures} times, the last at {human_bytes(have, size)}: {cause}; "
            "the next try resumes from there"
        )
        self.failures = failures
        self.have = have


class Refused(DownloadError):
    """The server answered with something else than the file (a 404, a 401, a 500)."""

    def __init__(self, url: str, status: int, headers: CIMultiDictProxy[str]) -> None:
        super().__init__(f"HTTP {status} at {url}")
        self.status = status
        self.headers = headers


class Mismatch(DownloadError):
    """What arrived is not the file the caller expects; it was removed."""

    def __init__(self, what: str, expected: str, got: str) -> None:
        super().__init__(
            f"{got} bytes where {expected} were expected"
            if what == "size"
            else f"{what} does not match (expected {expected}, got {got})"
        )
        # "size" (expected and got are numbers of bytes) or "sha256" (hex digests).
        self.what = what
        self.expected = expected
        self.got = got


class DiskFull(OSError):
    """The disk filled up under a download; size is the whole file's, when anyone said it."""

    def __init__(self, cause: OSError, size: int | None) -> None:
        super().__init__(errno.ENOSPC, cause.strerror or "No space left on device", cause.filename)
        self.size = size


@attrs.frozen
class Retries:
    """How often a cut-off download is tried again, and how long to wait before each try."""

    # Tries in all, the first included.
    attempts: int
    backoff: ExponentialBackoff


@attrs.frozen
class Downloaded:
    """A file whole in its .part file: its sha256 and size. The caller renames it into place."""

    sha256: str
    size: int


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    part: Path,
    *,
    retries: Retries,
    size: int | None = None,
    sha256: str | None = None,
    headers: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    received: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Downloaded:
    """url into part, resuming what is there; checked against size and sha256 when they are given.

    progress hears the bytes on disk at each try's start, then every 1/100 of the file or
    PROGRESS_EVERY_S seconds of clock, whichever comes first, while bytes arrive.
    received hears every chunk's length as it arrives (a node's count of bytes downloaded).
    Raises Interrupted, Refused, Mismatch, or DiskFull (an OSError, as is any other the disk raises).
    """
    await asyncio.to_thread(part.parent.mkdir, parents=True, exist_ok=True)
    attempt = _Attempt(session, url, part, size, dict(headers or {}), progress, received, clock)
    failures = 0
    while True:
        try:
            got = await attempt.run()
            break
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            failures += 1
            have = await asyncio.to_thread(size_on_disk, part)
            if failures >= retries.attempts:
                raise Interrupted(url, failures, have, size, str(exc) or type(exc).__name__) from None
            log.warning("a download was interrupted; resuming", url=url, at=have, error=str(exc))
            await asyncio.sleep(retries.backoff.delay(failures))
    if size is not None and got.size != size:
        await asyncio.to_thread(_unlink, part)
        raise Mismatch("size", str(size), str(got.size))
    if sha256 is not None and got.sha256 != sha256:
        await asyncio.to_thread(_unlink, part)
        raise Mismatch("sha256", sha256, got.sha256)
    return got


@attrs.define
class _Attempt:
    """One try at the file: what the bytes on disk are worth, then the rest from the server."""

    session: aiohttp.ClientSession
    url: str
    part: Path
    size: int | None
    headers: dict[str, str]
    progress: Progress | None
    received: Callable[[int], None] | None
    clock: Callable[[], float]

    def _tell(self, done: int, size: int | None) -> None:
        if self.progress is not None:
            self.progress(done, size)

    async def run(self) -> Downloaded:
        hasher = hashlib.sha256()
        offset = await asyncio.to_thread(hash_prefix, self.part, hasher)
        if self.size is not None and offset > self.size:
            # Longer than the file: not a prefix of it, whatever it is.
            await asyncio.to_thread(_unlink, self.part)
            hasher, offset = hashlib.sha256(), 0
        if offset and offset == self.size:
            # Whole already (cut off after the last byte, before its check): nothing to ask for.
            self._tell(offset, self.size)
            return Downloaded(hasher.hexdigest(), offset)
        headers = {**self.headers, **({"Range": f"bytes={offset}-"} if offset else {})}
        async with self.session.get(self.url, headers=headers) as response:
            if response.status == 416 and offset:
                if _unsatisfiable_length(response) == offset:
                    # The server has nothing past what we hold because we hold all of it.
                    self._tell(offset, offset)
                    return Downloaded(hasher.hexdigest(), offset)
                # Nothing past what we hold, and no word that it is whole: start over rather than trust it.
                await asyncio.to_thread(_unlink, self.part)
                raise aiohttp.ClientPayloadError(f"{self.url} refused to resume at byte {offset}")
            if response.status not in (200, 206):
                raise Refused(self.url, response.status, response.headers)
            if response.status == 200 and offset:
                # The server ignored the Range: what it sends is the whole file again.
                hasher, offset = hashlib.sha256(), 0
            declared = total_size(response, offset)
            written = await self._receive(response, hasher, offset, declared)
        if declared is not None and written != declared:
            raise aiohttp.ClientPayloadError(f"{self.url} ended at byte {written} of {declared}")
        return Downloaded(hasher.hexdigest(), written)

    async def _receive(
        self, response: aiohttp.ClientResponse, hasher: Any, offset: int, declared: int | None
    ) -> int:
        """The body appended to the partial file (which it replaces from offset 0); its length after."""
        size = self.size if self.size is not None else declared
        written = offset
        try:
            fh = await _open(self.part, "ab" if offset else "wb")
            try:
                step = max((size or 0) // _PROGRESS_STEPS, 64 * _CHUNK)
                self._tell(written, size)
                next_report, next_time = written + step, self.clock() + PROGRESS_EVERY_S
                # Each chunk written as it arrives: what had arrived when the connection dropped is
                # on disk, and the next try resumes after it.
                async for chunk in response.content.iter_chunked(_CHUNK):
                    await to_thread_to_the_end(write, fh, hasher, chunk)
                    written += len(chunk)
                    if self.received is not None:
                        self.received(len(chunk))
                    if written >= next_report or self.clock() >= next_time:
                        self._tell(written, size)
                        next_report, next_time = written + step, self.clock() + PROGRESS_EVERY_S
            finally:
                await to_thread_to_the_end(fh.close)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DiskFull(exc, size) from exc
            raise
        return written


async def _open(path: Path, mode: str) -> IO[bytes]:
    """path opened in a thread; a cancel landing meanwhile closes the file once the thread has opened it.

    A cancel stops the wait, not the thread: the file it opened went unclosed until collected (an agent
    stopped just as a download began), and pytest failed the next test on the ResourceWarning.
    """
    opening = asyncio.ensure_future(asyncio.to_thread(open, path, mode))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[IO[bytes]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _unsatisfiable_length(response: aiohttp.ClientResponse) -> int | None:
    """The file's length a 416 gives ("Content-Range: bytes */N"); None when it gives none."""
    unit, _, rest = response.headers.get("Content-Range", "").partition(" ")
    span, _, whole = rest.partition("/")
    return int(whole) if unit == "bytes" and span == "*" and whole.isdigit() else None


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


def size_on_disk(path: Path) -> int:
    """The file's size; 0 when there is none (blocking: in a thread)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)
