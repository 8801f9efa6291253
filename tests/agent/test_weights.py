"""The weights cache against a real loopback HTTP server: resumed downloads, pinned checksums, collection."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.agent.weights import MARKER, PART, WeightsCache, WeightsError, cache_key
from llmgw.roles.mirror import make_mirror_app

from ..waiting import eventually

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
    async def test_progress_moves_while_a_small_file_trickles_in(self, tmp_path: Path) -> None:
        """400 KB on a slow link read "slow.gguf: 0.0 of 400.0 KB" until it was whole."""
        size, first = 400_000, 100_000
        release = asyncio.Event()

        async def trickle(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            response.content_length = size
            await response.prepare(request)
            if request.method == "GET":
                await response.write(bytes(first))
                await release.wait()
                await response.write(bytes(size - first))
            return response

        app = web.Application()
        app.router.add_get("/m/slow.gguf", trickle)
        ticks = iter(range(0, 10_000, 10))
        seen: list[str] = []
        async with (
            TestServer(app) as slow,
            # Ten seconds pass between any two looks at the clock.
            WeightsCache(tmp_path / "weights", retry_base_s=0, clock=lambda: float(next(ticks))) as cache,
        ):
            fetch = asyncio.create_task(cache.fetch(str(slow.make_url("/m/slow.gguf")), {}, seen.append))
            try:
                await eventually(lambda: any(": 0.0 of" not in said for said in seen[1:]))
            finally:
                release.set()
            await fetch
        assert seen[0] == "downloading slow.gguf: 0.0 of 400.0 KB"

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
        with pytest.raises(WeightsError) as refused:
            await cache.fetch(source, {"model.gguf": "0" * 64})
        assert str(refused.value).startswith(
            f"weights model.gguf: sha256 does not match the pin (expected {'0' * 64}, got {DIGEST})"
        )
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
        with pytest.raises(WeightsError) as refused:
            await cache.fetch(origin.url + "nope.gguf", {})
        assert str(refused.value) == f"weights nope.gguf: HTTP 404 at {origin.url}nope.gguf"


class TestPins:
    """A copy already on disk serves a model only if it matches that model's own pins."""

    async def test_a_wrong_pin_is_refused_even_when_the_url_is_already_cached_unpinned(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        source = origin.url + "model.gguf"
        unpinned = await cache.fetch(source, {})
        with pytest.raises(WeightsError) as refused:
            await cache.fetch(source, {"model.gguf": "0" * 64})
        assert str(refused.value).startswith(
            f"weights model.gguf: sha256 does not match the pin (expected {'0' * 64}, got {DIGEST})"
        )
        # The unpinned model's copy is untouched, and still serves it.
        assert await cache.fetch(source, {}) == unpinned
        assert unpinned.read_bytes() == BLOB
        assert cache.path_of(source, {"model.gguf": "0" * 64}) is None

    async def test_a_right_pin_after_an_unpinned_fetch_uses_the_cached_copy_without_downloading(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        source = origin.url + "model.gguf"
        unpinned = await cache.fetch(source, {})
        assert await cache.fetch(source, {"model.gguf": "sha256:" + DIGEST.upper()}) == unpinned
        assert origin.ranges == [None]

    async def test_a_pin_matching_what_the_url_serves_now_is_fetched_into_its_own_path(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        """The file behind the URL changed since it was cached: each model gets the bytes it pinned."""
        source = origin.url + "model.gguf"
        old = await cache.fetch(source, {})
        newer = BLOB[::-1]
        origin.files["model.gguf"] = newer
        new = await cache.fetch(source, {"model.gguf": hashlib.sha256(newer).hexdigest()})
        assert new != old
        assert (old.read_bytes(), new.read_bytes()) == (BLOB, newer)
        assert sorted((w.source, w.sha256) for w in cache.present()) == sorted(
            [(source, DIGEST), (source, hashlib.sha256(newer).hexdigest())]
        )
        # Pinned to the old bytes, a third model is given the first copy.
        assert await cache.fetch(source, {"": DIGEST}) == old

    async def test_unpinned_after_pinned_uses_the_pinned_copy(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        source = origin.url + "model.gguf"
        pinned = await cache.fetch(source, {"model.gguf": DIGEST})
        assert await cache.fetch(source, {}) == pinned
        assert origin.ranges == [None]

    async def test_two_models_with_different_pins_for_one_url_each_get_their_own_verdict(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        source = origin.url + "model.gguf"
        right, wrong = {"model.gguf": DIGEST}, {"model.gguf": "1" * 64}
        # Started together: the wrong pin's download must not be shared with, nor fail, the right one.
        results = await asyncio.gather(
            cache.fetch(source, wrong), cache.fetch(source, right), return_exceptions=True
        )
        assert isinstance(results[0], WeightsError)
        assert "sha256 does not match the pin" in str(results[0])
        assert isinstance(results[1], Path) and results[1].read_bytes() == BLOB
        # And once the right one is cached, the wrong one is still refused, not handed that copy.
        with pytest.raises(WeightsError, match=f"expected {'1' * 64}, got {DIGEST}"):
            await cache.fetch(source, wrong)
        assert await cache.fetch(source, right) == results[1]

    async def test_pins_are_checked_against_copies_found_on_disk_at_start(
        self, origin: Origin, tmp_path: Path
    ) -> None:
        source = origin.url + "model.gguf"
        async with WeightsCache(tmp_path / "w") as first:
            await first.fetch(source, {})
        async with WeightsCache(tmp_path / "w") as second:
            with pytest.raises(WeightsError, match="sha256 does not match the pin"):
                await second.fetch(source, {"model.gguf": "2" * 64})
            assert await second.fetch(source, {"model.gguf": DIGEST}) == second.path_of(source)
        assert len(origin.ranges) == 2

    async def test_a_copy_whose_marker_kept_no_digest_is_hashed_once_and_the_digest_kept(
        self, origin: Origin, tmp_path: Path
    ) -> None:
        source = origin.url + "model.gguf"
        async with WeightsCache(tmp_path / "w") as first:
            await first.fetch(source, {})
        marker = tmp_path / "w" / cache_key(source) / MARKER
        old = json.loads(marker.read_text())
        for f in old["files"]:
            del f["sha256"]
        marker.write_text(json.dumps(old))
        async with WeightsCache(tmp_path / "w") as second:
            with pytest.raises(WeightsError, match=f"got {DIGEST}"):
                await second.fetch(source, {"model.gguf": "3" * 64})
        assert json.loads(marker.read_text())["files"][0]["sha256"] == DIGEST

    async def test_a_pin_that_names_no_file_of_the_source_is_refused(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        source = origin.url + "model.gguf"
        with pytest.raises(WeightsError) as refused:
            await cache.fetch(source, {"modle.gguf": DIGEST})
        assert str(refused.value) == (
            f"weights model.gguf: the sha256 pin for 'modle.gguf' names no file of {source} "
            "(it has: model.gguf)"
        )
        assert cache.present() == []

    async def test_a_source_whose_file_name_is_dot_dot_is_refused_before_anything_is_fetched(
        self, origin: Origin, cache: WeightsCache
    ) -> None:
        """From a control plane that did not check it: the file would be renamed over the cache's parent."""
        with pytest.raises(WeightsError, match="names no file"):
            await cache.fetch(origin.url + "w/..", {})
        assert origin.ranges == []


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
        with pytest.raises(WeightsError) as refused:
            await cache.fetch(mirror + "nothing/", {})
        assert str(refused.value) == f"weights nothing/: HTTP 404 at {mirror}nothing/"


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
