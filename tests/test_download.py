"""The one resumable download, against a real loopback server that can misbehave the ways servers do."""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO

import aiohttp
import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw import download
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.weights import WeightsCache, cache_key
from llmgw.backoff import ExponentialBackoff
from llmgw.download import PART, Downloaded, human_bytes
from llmgw.mirror.fetch import INCOMING, HubFetcher
from tests.waiting import eventually

BLOB = bytes(range(256)) * 4096  # 1 MiB, every byte position distinguishable
DIGEST = hashlib.sha256(BLOB).hexdigest()
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@attrs.define
class Server:
    """Serves BLOB at /f/blob, and as a mirror directory and a hub repository, with faults to switch on."""

    url: str = ""
    # The Range header of every request for the file's bytes, None when it had none.
    ranges: list[str | None] = attrs.field(factory=list)
    ignore_range: bool = False
    # Answer the next requests with these statuses instead of the file.
    statuses: list[int] = attrs.field(factory=list)
    # Whether a 416 says how long the file is ("Content-Range: bytes */N"), as RFC 7233 asks.
    length_in_416: bool = True
    # Bytes of a body to send before hanging up, for the next requests in turn.
    cut_after: list[int] = attrs.field(factory=list)

    async def serve(self, request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Range")
        self.ranges.append(header)
        if self.statuses:
            return web.Response(status=self.statuses.pop(0))
        start = int(header.removeprefix("bytes=").rstrip("-")) if header and not self.ignore_range else 0
        if header and start >= len(BLOB):
            # What aiohttp's file responses (the mirror role's) answer a Range past the end.
            headers = {"Content-Range": f"bytes */{len(BLOB)}"} if self.length_in_416 else {}
            raise web.HTTPRequestRangeNotSatisfiable(headers=headers)
        response = web.StreamResponse(status=206 if start else 200)
        response.content_length = len(BLOB) - start
        if start:
            response.headers["Content-Range"] = f"bytes {start}-{len(BLOB) - 1}/{len(BLOB)}"
        await response.prepare(request)
        cut = self.cut_after.pop(0) if self.cut_after else None
        await response.write(BLOB[start:] if cut is None else BLOB[start : start + cut])
        if cut is not None:
            # Hang up mid-body: the client holds fewer bytes than Content-Length promised.
            request.protocol.force_close()
        return response


def _app(state: Server) -> web.Application:
    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"files": [{"path": "model.bin", "size": len(BLOB)}]})

    async def info(request: web.Request) -> web.Response:
        sibling = {"rfilename": "model.bin", "size": len(BLOB), "lfs": {"sha256": DIGEST, "size": len(BLOB)}}
        return web.json_response({"id": "org/model", "sha": COMMIT, "siblings": [sibling]})

    app = web.Application()
    app.router.add_get("/f/blob", state.serve)
    app.router.add_get("/files/d/", listing)
    app.router.add_get("/files/d/model.bin", state.serve)
    app.router.add_get("/api/models/org/model/revision/{rev}", info)
    app.router.add_get("/org/model/resolve/{rev}/model.bin", state.serve)
    return app


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    runner = web.AppRunner(_app(state), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


RETRIES = download.Retries(attempts=3, backoff=ExponentialBackoff(base_s=0))


async def _part(tmp_path: Path, data: bytes | None = None) -> Path:
    part = tmp_path / "sub" / ("blob" + PART)
    if data is not None:
        await asyncio.to_thread(part.parent.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(part.write_bytes, data)
    return part


async def _holds(part: Path) -> bytes:
    return await asyncio.to_thread(part.read_bytes)


class TestResuming:
    async def test_a_file_is_downloaded_whole_and_hashed_as_written(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        part = await _part(tmp_path)
        got = await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES)
        assert got == Downloaded(DIGEST, len(BLOB))
        assert await _holds(part) == BLOB
        assert server.ranges == [None]

    async def test_a_partial_file_is_resumed_with_a_range_request(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        part = await _part(tmp_path, BLOB[:1000])
        got = await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES)
        assert got == Downloaded(DIGEST, len(BLOB))
        assert server.ranges == ["bytes=1000-"]

    async def test_a_server_that_ignores_the_range_replaces_the_partial_file(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        server.ignore_range = True
        part = await _part(tmp_path, BLOB[:1000])
        got = await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES)
        assert got == Downloaded(DIGEST, len(BLOB))
        assert await _holds(part) == BLOB

    async def test_a_body_cut_off_midway_is_resumed_on_the_next_try(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        server.cut_after = [len(BLOB) // 2]
        part = await _part(tmp_path)
        got = await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES)
        assert got == Downloaded(DIGEST, len(BLOB))
        first, resumed = server.ranges
        # The second try asks for the rest after what reached the disk: the hang-up may lose the
        # last bytes sent, all of them on a slow machine, and then it asks for the whole file.
        assert first is None
        assert resumed is None or 0 < int(resumed.removeprefix("bytes=").rstrip("-")) <= len(BLOB) // 2

    async def test_a_download_cut_off_on_every_try_says_how_far_it_got_and_keeps_it(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        server.cut_after = [300_000, 300_000]
        part = await _part(tmp_path)
        retries = download.Retries(attempts=2, backoff=ExponentialBackoff(base_s=0))
        with pytest.raises(download.Interrupted, match=r"failed 2 times, the last at .* resumes from there"):
            await download.fetch(session, server.url + "/f/blob", part, retries=retries)
        held = await _holds(part)
        assert len(held) <= 600_000 and BLOB.startswith(held)


class TestWhatIsOnDisk:
    async def test_a_partial_file_already_whole_asks_the_server_nothing(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        part = await _part(tmp_path, BLOB)
        got = await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES, size=len(BLOB))
        assert got == Downloaded(DIGEST, len(BLOB))
        assert server.ranges == []

    async def test_a_partial_file_longer_than_the_file_is_started_over_without_asking_past_its_end(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        part = await _part(tmp_path, BLOB + b"left over")
        got = await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES, size=len(BLOB))
        assert got == Downloaded(DIGEST, len(BLOB))
        assert server.ranges == [None]
        assert await _holds(part) == BLOB

    async def test_a_416_that_says_the_file_is_that_long_means_the_partial_file_is_whole(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        part = await _part(tmp_path, BLOB)
        got = await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES)
        assert got == Downloaded(DIGEST, len(BLOB))
        assert server.ranges == [f"bytes={len(BLOB)}-"]

    async def test_a_416_that_does_not_say_how_long_the_file_is_starts_over(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        server.length_in_416 = False
        part = await _part(tmp_path, BLOB)
        got = await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES)
        assert got == Downloaded(DIGEST, len(BLOB))
        assert server.ranges == [f"bytes={len(BLOB)}-", None]


class TestCancelled:
    async def test_a_download_cancelled_while_its_file_is_opening_closes_the_file_it_opened(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An agent stopped just as a download begins: the thread opening the file outlives the cancel."""
        opened: list[IO[bytes]] = []
        asked, may_open = threading.Event(), threading.Event()

        def held_open(path: Path, mode: str) -> IO[bytes]:
            asked.set()
            may_open.wait(30)
            fh = builtins.open(path, mode)  # noqa: SIM115 - the code under test closes it, or the test fails
            opened.append(fh)
            return fh

        monkeypatch.setattr(download, "open", held_open, raising=False)
        part = await _part(tmp_path)
        fetching = asyncio.create_task(download.fetch(session, server.url + "/f/blob", part, retries=RETRIES))
        await eventually(asked.is_set)
        fetching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fetching
        may_open.set()
        await eventually(lambda: len(opened) == 1 and opened[0].closed)


class TestChecks:
    async def test_a_file_that_does_not_match_its_sha256_is_removed(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        part = await _part(tmp_path)
        with pytest.raises(download.Mismatch) as caught:
            await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES, sha256="0" * 64)
        assert (caught.value.what, caught.value.expected, caught.value.got) == ("sha256", "0" * 64, DIGEST)
        assert not await asyncio.to_thread(part.exists)

    async def test_a_file_of_another_size_than_expected_is_removed(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        part = await _part(tmp_path)
        with pytest.raises(
            download.Mismatch, match=f"^{len(BLOB)} bytes where {len(BLOB) + 1} were expected"
        ):
            await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES, size=len(BLOB) + 1)
        assert not await asyncio.to_thread(part.exists)

    async def test_an_answer_that_is_not_the_file_is_refused_with_its_status(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        server.statuses = [404]
        part = await _part(tmp_path)
        with pytest.raises(download.Refused) as caught:
            await download.fetch(session, server.url + "/f/blob", part, retries=RETRIES)
        assert caught.value.status == 404
        assert str(caught.value) == f"HTTP 404 at {server.url}/f/blob"


class TestProgress:
    async def test_progress_is_told_at_each_tries_start_with_the_whole_size_and_every_chunk_counted(
        self, server: Server, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        server.cut_after = [300_000]
        told: list[tuple[int, int | None]] = []
        received: list[int] = []
        part = await _part(tmp_path)
        await download.fetch(
            session,
            server.url + "/f/blob",
            part,
            retries=RETRIES,
            progress=lambda done, size: told.append((done, size)),
            received=received.append,
            # Time stands still: only the bytes' steps count.
            clock=lambda: 0.0,
        )
        assert told[0] == (0, len(BLOB))
        # The resumed try starts from what the first left on disk, against the same whole.
        assert len(told) == 2 and told[1][0] <= 300_000 and told[1][1] == len(BLOB)
        assert len(BLOB) <= sum(received) <= len(BLOB) + 300_000

    async def test_progress_moves_with_time_before_a_slow_download_of_a_small_file_ends(
        self, session: aiohttp.ClientSession, tmp_path: Path
    ) -> None:
        """400 KB at a trickle read "0.0 of 400.0 KB" until whole: by bytes it moved once per 64 MiB."""
        size, first = 400_000, 100_000
        release = asyncio.Event()

        async def trickle(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            response.content_length = size
            await response.prepare(request)
            await response.write(bytes(first))
            await release.wait()
            await response.write(bytes(size - first))
            return response

        app = web.Application()
        app.router.add_get("/slow.gguf", trickle)
        async with TestServer(app) as slow:
            ticks = iter(range(0, 10_000, 10))
            told: list[tuple[int, int | None]] = []
            fetching = asyncio.create_task(
                download.fetch(
                    session,
                    str(slow.make_url("/slow.gguf")),
                    await _part(tmp_path),
                    retries=RETRIES,
                    progress=lambda done, whole: told.append((done, whole)),
                    # Ten seconds pass between any two looks at the clock.
                    clock=lambda: float(next(ticks)),
                )
            )
            try:
                await eventually(lambda: any(done > 0 for done, _ in told))
            finally:
                release.set()
            assert (await fetching).size == size
        assert told[0] == (0, size)


def test_sizes_read_in_the_unit_of_the_total() -> None:
    assert human_bytes(1_200_000_000, 4_100_000_000) == "1.2 of 4.1 GB"
    assert human_bytes(300_000, 1_048_576) == "0.3 of 1.0 MB"


# --- through both callers: the agent's weights cache and the mirror's fetch from a hub --------


@attrs.frozen
class Caller:
    """Where a caller keeps its partial file, and a fetch through it that answers the bytes it placed."""

    part: Callable[[Server, Path], Path]
    fetch: Callable[[Server, Path], Awaitable[bytes]]


async def _agent_fetch(server: Server, tmp_path: Path) -> bytes:
    async with WeightsCache(tmp_path / "weights", retry_base_s=0) as cache:
        path = await cache.fetch(server.url + "/files/d/", {"model.bin": DIGEST})
    return await asyncio.to_thread((path / "model.bin").read_bytes)


async def _mirror_fetch(server: Server, tmp_path: Path) -> bytes:
    async with HubFetcher(tmp_path / "mirror", server.url, None, attempts=3, retry_base_s=0) as fetcher:
        await fetcher.fetch("org/model", "main")
    return await asyncio.to_thread((tmp_path / "mirror" / "org" / "model" / COMMIT / "model.bin").read_bytes)


CALLERS = {
    "agent weights": Caller(
        part=lambda s, t: t / "weights" / cache_key(s.url + "/files/d/") / ("model.bin" + PART),
        fetch=_agent_fetch,
    ),
    "mirror fetch": Caller(
        part=lambda s, t: t / "mirror" / INCOMING / "org" / "model" / COMMIT / ("model.bin" + PART),
        fetch=_mirror_fetch,
    ),
}


@pytest.mark.parametrize("caller", CALLERS.values(), ids=CALLERS.keys())
@pytest.mark.parametrize(
    ("on_disk", "asked"),
    [
        pytest.param(BLOB, [], id="a partial file already whole is not asked for again"),
        pytest.param(BLOB + b"left over", [None], id="a partial file past the size is fetched again whole"),
    ],
)
async def test_both_callers_judge_a_partial_file_by_the_size_they_expect(
    server: Server, tmp_path: Path, caller: Caller, on_disk: bytes, asked: list[str | None]
) -> None:
    part = caller.part(server, tmp_path)
    await asyncio.to_thread(part.parent.mkdir, parents=True)
    await asyncio.to_thread(part.write_bytes, on_disk)
    assert await caller.fetch(server, tmp_path) == BLOB
    assert server.ranges == asked


async def test_an_engine_archive_cut_off_midway_is_resumed_and_its_size_told_once(
    server: Server, tmp_path: Path
) -> None:
    server.cut_after = [300_000]
    sizes: list[int | None] = []
    async with ReleaseClient(retry_base_s=0) as releases:
        digest = await releases.download(
            server.url + "/f/blob", tmp_path / "llama.tar.gz", on_size=sizes.append
        )
    assert digest == DIGEST
    assert sizes == [len(BLOB)]
    assert len(server.ranges) == 2
