"""The weights cache against a real loopback HTTP server: resumed downloads, pinned checksums, collection."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from aiohttp import web

from llmgw.agent.weights import PART, WeightsCache, WeightsError, cache_key, human_bytes
from llmgw.roles.mirror import make_mirror_app

BLOB = bytes(range(256)) * 4096  # 1 MiB, every byte position distinguishable
DIGEST = hashlib.sha256(BLOB).hexdigest()


@attrs.define
class Origin:
    """A file server that answers Range requests and can hang up partway through a body."""

    url: str
    files: dict[str, bytes]
    # Bytes of a body to send before dropping the connection, for the next requests in turn.
    cut_after: list[int] = attrs.field(factory=list)
    ranges: list[str | None] = attrs.field(factory=list)
    bytes_sent: int = 0
    # Set once a cut request has sent its bytes; the test decides what happens next.
    cut: asyncio.Event = attrs.field(factory=asyncio.Event)
    hold_after_cut: bool = False
    release: asyncio.Event = attrs.field(factory=asyncio.Event)


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    state = Origin(url="", files={"model.gguf": BLOB})

    async def serve(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        body = state.files.get(name)
        if body is None:
            raise web.HTTPNotFound()
        header = request.headers.get("Range")
        state.ranges.append(header)
        start = int(header.removeprefix("bytes=").rstrip("-")) if header else 0
        response = web.StreamResponse(status=206 if header else 200)
        response.content_length = len(body) - start
        if header:
            response.headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
        await response.prepare(request)
        cut = state.cut_after.pop(0) if state.cut_after else None
        rest = body[start:] if cut is None else body[start : start + cut]
        await response.write(rest)
        state.bytes_sent += len(rest)
        if cut is not None:
            state.cut.set()
            if state.hold_after_cut:
                await state.release.wait()
            # Hang up mid-body: the client has fewer bytes than Content-Length promised. Through the
            # protocol, which every request has: its transport is None once the client has gone.
            request.protocol.force_close()
        return response

    app = web.Application()
    app.router.add_get("/m/{name}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}/m/"
    yield state
    state.release.set()
    await runner.cleanup()


async def _part_file_holds(part: Path, size: int, within_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while (await asyncio.to_thread(lambda: part.exists() and part.stat().st_size)) != size:
        assert loop.time() < deadline, f"the first {size} bytes never reached {part.name}"
        await asyncio.sleep(0.01)


@pytest.fixture
async def cache(tmp_path: Path) -> AsyncIterator[WeightsCache]:
    async with WeightsCache(tmp_path / "weights", retry_base_s=0) as c:
        yield c


class TestFetch:
    async def test_a_file_is_fetched_once_and_then_present(self, origin: Origin, cache: WeightsCache) -> None:
        seen: list[str] = []
        path = await cache.fetch(origin.url + "model.gguf", {}, seen.append)
        assert path.read_bytes() == BLOB
        assert path.name == "model.gguf"
        assert seen[0].startswith("downloading model.gguf: 0.0 of 1.0 MB")
        assert await cache.fetch(origin.url + "model.gguf", {}) == path
        assert len(origin.ranges) == 1
        (weights,) = cache.present()
        assert (weights.source, weights.size_bytes, weights.sha256) == (
            origin.url + "model.gguf",
            len(BLOB),
            DIGEST,
        )

    async def test_a_download_cut_off_midway_resumes_where_it_stopped(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        origin.cut_after, origin.hold_after_cut = [300_000], True
        source = origin.url + "model.gguf"
        fetch = asyncio.create_task(cache.fetch(source, {"model.gguf": DIGEST}))
        await origin.cut.wait()
        # Hung up only once the bytes sent are on disk: bytes still in the client's buffer when the
        # connection drops are lost to the error, and the resume would start before them.
        await _part_file_holds(cache.root / cache_key(source) / ("model.gguf" + PART), 300_000)
        origin.release.set()
        path = await fetch
        assert path.read_bytes() == BLOB
        assert origin.ranges == [None, "bytes=300000-"]
        assert origin.bytes_sent == len(BLOB)
        # Every byte received is counted once, the resumed part after the cut too.
        assert cache.downloaded_bytes == len(BLOB)

    async def test_an_agent_stopped_midway_leaves_a_part_file_the_next_one_resumes(
        self, origin: Origin, tmp_path: Path
    ) -> None:
        origin.cut_after, origin.hold_after_cut = [400_000], True
        source = origin.url + "model.gguf"
        async with WeightsCache(tmp_path / "w", retry_base_s=0) as first:
            fetch = asyncio.create_task(first.fetch(source, {}))
            await origin.cut.wait()
            # The bytes sent may still be in flight to the file; wait until they are written.
            await _part_file_holds(tmp_path / "w" / cache_key(source) / ("model.gguf" + PART), 400_000)
            fetch.cancel()
            with pytest.raises(asyncio.CancelledError):
                await fetch
            assert first.present() == [], "a partial file must never count as present"
        async with WeightsCache(tmp_path / "w", retry_base_s=0) as second:
            assert second.present() == []
            origin.hold_after_cut = False
            path = await second.fetch(source, {"": "sha256:" + DIGEST})
        assert path.read_bytes() == BLOB
        assert origin.ranges == [None, "bytes=400000-"]

    async def test_a_download_that_does_not_match_its_checksum_is_refused(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        source = origin.url + "model.gguf"
        with pytest.raises(WeightsError, match="does not match its pinned sha256"):
            await cache.fetch(source, {"model.gguf": "0" * 64})
        assert cache.present() == []
        assert cache.path_of(source) is None
        assert not list((cache.root / cache_key(source)).iterdir())

    async def test_two_shards_of_one_model_share_one_download(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        source = origin.url + "model.gguf"
        a, b = await asyncio.gather(cache.fetch(source, {}), cache.fetch(source, {}))
        assert a == b
        assert origin.ranges == [None]

    async def test_a_missing_file_fails_with_the_servers_answer(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        with pytest.raises(WeightsError, match="answered 404"):
            await cache.fetch(origin.url + "nope.gguf", {})


class TestDirectories:
    @pytest.fixture
    async def mirror(self, tmp_path: Path) -> AsyncIterator[str]:
        root = tmp_path / "mirror"
        (root / "llama" / "v1" / "tokenizer").mkdir(parents=True)
        (root / "llama" / "v1" / "config.json").write_text("{}")
        (root / "llama" / "v1" / "model.safetensors").write_bytes(BLOB)
        (root / "llama" / "v1" / "tokenizer" / "vocab.json").write_text('{"a": 1}')
        # In a thread: add_static resolves the root on the disk.
        runner = web.AppRunner(await asyncio.to_thread(make_mirror_app, root), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/files/"
        await runner.cleanup()

    async def test_a_directory_is_fetched_whole_from_the_mirrors_listing(
        self, mirror: str, cache: WeightsCache
    ) -> None:
        source = mirror + "llama/v1/"
        seen: list[str] = []
        path = await cache.fetch(source, {"model.safetensors": DIGEST}, seen.append)
        assert path.is_dir()
        assert (path / "model.safetensors").read_bytes() == BLOB
        assert (path / "tokenizer" / "vocab.json").read_text() == '{"a": 1}'
        assert any("(2 of 3 files)" in line for line in seen)
        (weights,) = cache.present()
        assert weights.size_bytes == len(BLOB) + 2 + 8

    async def test_a_directory_the_mirror_does_not_have_is_refused(
        self, mirror: str, cache: WeightsCache
    ) -> None:
        with pytest.raises(WeightsError, match="answered 404"):
            await cache.fetch(mirror + "nothing/", {})


class TestCollect:
    async def test_collect_keeps_weights_an_engine_uses_and_removes_the_rest(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        origin.files["other.gguf"] = b"x" * 1000
        used, unused = origin.url + "model.gguf", origin.url + "other.gguf"
        await cache.fetch(used, {})
        await cache.fetch(unused, {})
        removed, kept = await cache.remove([used, unused], in_use={used})
        assert removed == [unused]
        assert kept == [f"{used} (an engine on this node uses it)"]
        assert [w.source for w in cache.present({used})] == [used]
        assert cache.present({used})[0].in_use
        assert not (cache.root / cache_key(unused)).exists()

    async def test_weights_found_on_disk_at_start_are_present_and_partial_ones_are_not(
        self, origin: Origin, tmp_path: Path
    ) -> None:
        source = origin.url + "model.gguf"
        async with WeightsCache(tmp_path / "w") as first:
            await first.fetch(source, {})
        partial = tmp_path / "w" / cache_key(origin.url + "half.gguf")
        partial.mkdir()
        (partial / ("half.gguf" + PART)).write_bytes(b"half")
        async with WeightsCache(tmp_path / "w") as second:
            assert [w.source for w in second.present()] == [source]


def test_sizes_read_in_the_unit_of_the_total() -> None:
    assert human_bytes(1_200_000_000, 4_100_000_000) == "1.2 of 4.1 GB"
    assert human_bytes(300_000, 1_048_576) == "0.3 of 1.0 MB"
