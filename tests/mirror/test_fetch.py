"""Fetching a model repository from a hub into the mirror, against a fake hub on loopback with real bytes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import structlog
from aiohttp import web

from llmgw.mirror.fetch import (
    INCOMING,
    MANIFEST,
    PART,
    FetchError,
    FetchProgress,
    HubFetcher,
    read_model,
    read_token,
)
from llmgw.roles.mirror import make_mirror_app

WEIGHTS = bytes(range(256)) * 8192  # 2 MiB, every byte position distinguishable
CONFIG = b'{"architectures": ["LlamaForCausalLM"]}\n'
TOKENIZER = b'{"model": {"vocab": {"a": 1}}}\n'
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_secret_token_that_must_never_be_printed"


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()


@attrs.define
class Hub:
    """A Hugging Face–compatible hub: model-info and resolve routes, with faults a test switches on."""

    url: str = ""
    files: dict[str, bytes] = attrs.field(
        factory=lambda: {
            ".gitattributes": b"*.safetensors filter=lfs\n",
            "config.json": CONFIG,
            "model.safetensors": WEIGHTS,
            "tokenizer/tokenizer.json": TOKENIZER,
        }
    )
    lfs: set[str] = attrs.field(factory=lambda: {"model.safetensors"})
    gated: bool = False
    # As the Hugging Face hub does it: a gated model's metadata is public, its files are not.
    gated_files_only: bool = False
    # What the resolve route sends instead of a file's real bytes.
    tampered: dict[str, bytes] = attrs.field(factory=dict)
    # Files listed by model-info that the resolve route answers with 404.
    gone: set[str] = attrs.field(factory=set)
    # Bytes of a body to send before hanging up, for the next file requests in turn.
    cut_after: list[int] = attrs.field(factory=list)
    # (revision, path, Range header) of every file request.
    requests: list[tuple[str, str, str | None]] = attrs.field(factory=list)
    authorizations: list[str | None] = attrs.field(factory=list)
    # While set, file requests wait for release: a fetch a test can catch in flight.
    hold: bool = False
    release: asyncio.Event = attrs.field(factory=asyncio.Event)

    def allowed(self, request: web.Request) -> bool:
        self.authorizations.append(request.headers.get("Authorization"))
        return not self.gated or request.headers.get("Authorization") == f"Bearer {TOKEN}"


def hub_app(state: Hub) -> web.Application:
    """The hub's model-info and resolve routes over state."""

    async def info(request: web.Request) -> web.Response:
        if f"{request.match_info['org']}/{request.match_info['name']}" != "org/model":
            return web.json_response({"error": "Repository not found"}, status=404)
        if not state.gated_files_only and not state.allowed(request):
            return web.json_response(
                {"error": "Access to this model is restricted"},
                status=401,
                headers={"X-Error-Code": "GatedRepo"},
            )
        if request.match_info["rev"] not in ("main", COMMIT):
            return web.json_response(
                {"error": "Invalid rev id"}, status=404, headers={"X-Error-Code": "RevisionNotFound"}
            )
        siblings = []
        for path, data in state.files.items():
            entry: dict[str, object] = {"rfilename": path, "size": len(data), "blobId": _git_blob_id(data)}
            if path in state.lfs:
                entry["lfs"] = {
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
            siblings.append(entry)
        return web.json_response({"id": "org/model", "sha": COMMIT, "siblings": siblings})

    async def resolve(request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        header = request.headers.get("Range")
        state.requests.append((request.match_info["rev"], path, header))
        if not state.allowed(request) or (state.gated_files_only and "Authorization" not in request.headers):
            raise web.HTTPUnauthorized(headers={"X-Error-Code": "GatedRepo"})
        if state.hold:
            await state.release.wait()
        if path not in state.files or path in state.gone:
            raise web.HTTPNotFound()
        body = state.tampered.get(path, state.files[path])
        start = int(header.removeprefix("bytes=").rstrip("-")) if header else 0
        response = web.StreamResponse(status=206 if header else 200)
        response.content_length = len(body) - start
        if header:
            response.headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
        await response.prepare(request)
        cut = state.cut_after.pop(0) if state.cut_after else None
        await response.write(body[start:] if cut is None else body[start : start + cut])
        if cut is not None:
            # Hang up mid-body: the client holds fewer bytes than Content-Length promised.
            request.protocol.force_close()
        return response

    app = web.Application()
    app.router.add_get("/api/models/{org}/{name}/revision/{rev}", info)
    app.router.add_get("/{org}/{name}/resolve/{rev}/{path:.+}", resolve)
    return app


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    state = Hub()
    runner = web.AppRunner(hub_app(state), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    state.release.set()
    await runner.cleanup()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "mirror"


def _fetcher(hub: Hub, root: Path, token: str | None = None, attempts: int = 3) -> HubFetcher:
    return HubFetcher(root, hub.url, token, attempts=attempts, retry_base_s=0)


def _tree(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


class TestFetching:
    async def test_a_revision_is_fetched_at_its_commit_with_every_file_pinned(
        self, hub: Hub, root: Path
    ) -> None:
        seen: list[FetchProgress] = []
        async with _fetcher(hub, root) as fetcher:
            model = await fetcher.fetch("org/model", "main", progress=seen.append)
        assert model.commit == COMMIT
        directory = root / "org" / "model" / COMMIT
        assert _tree(directory) == [MANIFEST, "config.json", "model.safetensors", "tokenizer/tokenizer.json"]
        assert (directory / "model.safetensors").read_bytes() == WEIGHTS
        assert model.pins()["model.safetensors"] == hashlib.sha256(WEIGHTS).hexdigest()
        assert await asyncio.to_thread(read_model, directory) == model
        # The branch is resolved once; every file comes from the commit, so a push midway cannot mix versions.
        assert {rev for rev, _, _ in hub.requests} == {COMMIT}
        assert not (root / INCOMING).exists() or _tree(root / INCOMING) == []

    async def test_progress_is_told_per_file_and_in_total(self, hub: Hub, root: Path) -> None:
        seen: list[FetchProgress] = []
        async with _fetcher(hub, root) as fetcher:
            model = await fetcher.fetch("org/model", "main", progress=seen.append)
        last = seen[-1]
        assert (last.done, last.total) == (model.size, model.size)
        assert {p.file for p in seen} == {"config.json", "model.safetensors", "tokenizer/tokenizer.json"}
        weights = [p for p in seen if p.file == "model.safetensors"]
        assert weights[-1].file_done == weights[-1].file_size == len(WEIGHTS)
        assert "(2 of 3 files)" in weights[-1].describe() and "in all" in weights[-1].describe()

    async def test_include_fetches_only_matching_files_and_a_later_one_adds_to_them(
        self, hub: Hub, root: Path
    ) -> None:
        async with _fetcher(hub, root) as fetcher:
            await fetcher.fetch("org/model", "main", ["*.json"])
            directory = root / "org" / "model" / COMMIT
            assert _tree(directory) == [MANIFEST, "config.json", "tokenizer/tokenizer.json"]
            hub.requests.clear()
            model = await fetcher.fetch("org/model", COMMIT, ["*.safetensors", "config.json"])
        assert [path for _, path, _ in hub.requests] == ["model.safetensors"]
        assert sorted(model.pins()) == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
        assert _tree(directory) == [MANIFEST, "config.json", "model.safetensors", "tokenizer/tokenizer.json"]

    async def test_an_include_that_matches_nothing_says_what_the_repository_has(
        self, hub: Hub, root: Path
    ) -> None:
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(FetchError, match=r"no file to fetch matches --include '\*\.gguf' \(it has: "):
                await fetcher.fetch("org/model", "main", ["*.gguf"])

    async def test_a_model_already_on_the_mirror_is_not_downloaded_again(self, hub: Hub, root: Path) -> None:
        async with _fetcher(hub, root) as fetcher:
            await fetcher.fetch("org/model", "main")
            hub.requests.clear()
            await fetcher.fetch("org/model", "main")
        assert hub.requests == []


class TestChecks:
    async def test_a_tampered_weights_file_is_refused_and_nothing_is_put_in_place(
        self, hub: Hub, root: Path
    ) -> None:
        hub.tampered["model.safetensors"] = bytes(len(WEIGHTS))
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(FetchError) as caught:
                await fetcher.fetch("org/model", "main")
        message = str(caught.value)
        assert "org/model@0123456789ab: model.safetensors: sha256 does not match the hub's" in message
        assert hashlib.sha256(WEIGHTS).hexdigest() in message
        assert not (root / "org" / "model" / COMMIT).exists()
        assert not any(p.endswith(PART) for p in await asyncio.to_thread(_tree, root))

    async def test_a_tampered_small_file_is_caught_by_its_git_blob_id(self, hub: Hub, root: Path) -> None:
        hub.tampered["config.json"] = CONFIG.replace(b"Llama", b"Evil!")
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(FetchError, match=r"config\.json: git blob id does not match the hub's"):
                await fetcher.fetch("org/model", "main")
        assert not (root / "org" / "model" / COMMIT).exists()

    async def test_a_file_the_hub_answers_with_404_is_named(self, hub: Hub, root: Path) -> None:
        hub.gone.add("tokenizer/tokenizer.json")
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(
                FetchError, match=r"tokenizer/tokenizer\.json: HTTP 404 at http://127\.0\.0\.1"
            ):
                await fetcher.fetch("org/model", "main")
        assert not (root / "org" / "model" / COMMIT).exists()

    async def test_a_repository_the_hub_does_not_have_is_named(self, hub: Hub, root: Path) -> None:
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(FetchError, match=r"org/nothing@main: no such repository or revision"):
                await fetcher.fetch("org/nothing", "main")

    async def test_a_revision_the_repository_does_not_have_is_named(self, hub: Hub, root: Path) -> None:
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(FetchError, match=r"org/model@v9: the repository has no revision 'v9'"):
                await fetcher.fetch("org/model", "v9")

    async def test_a_hub_listing_a_path_outside_the_repository_is_refused(self, hub: Hub, root: Path) -> None:
        hub.files["../../escape.txt"] = b"x"
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(
                FetchError, match=r"lists '\.\./\.\./escape\.txt', which is not a path inside"
            ):
                await fetcher.fetch("org/model", "main")
        assert not (root.parent / "escape.txt").exists()

    async def test_a_root_that_cannot_be_written_is_named(self, hub: Hub, tmp_path: Path) -> None:
        blocked = tmp_path / "not-a-directory"
        await asyncio.to_thread(blocked.write_text, "")
        async with _fetcher(hub, blocked) as fetcher:
            with pytest.raises(FetchError, match=r"org/model@0123456789ab: cannot write .*not-a-directory"):
                await fetcher.fetch("org/model", "main")


class TestResuming:
    async def test_an_interrupted_download_resumes_where_it_stopped(self, hub: Hub, root: Path) -> None:
        half = len(WEIGHTS) // 2
        hub.files = {"model.safetensors": WEIGHTS}
        hub.cut_after = [half]
        async with _fetcher(hub, root, attempts=1) as fetcher:
            with pytest.raises(
                FetchError, match=r"model\.safetensors: downloading .* failed 1 times.* resumes"
            ):
                await fetcher.fetch("org/model", "main")
        part = root / INCOMING / "org" / "model" / COMMIT / ("model.safetensors" + PART)
        # What reached the disk before the hang-up (the connection may drop some of what was sent).
        held = part.stat().st_size
        assert 0 < held <= half
        async with _fetcher(hub, root) as fetcher:
            model = await fetcher.fetch("org/model", "main")
        assert hub.requests[-1] == (COMMIT, "model.safetensors", f"bytes={held}-")
        assert (root / "org" / "model" / COMMIT / "model.safetensors").read_bytes() == WEIGHTS
        assert model.pins()["model.safetensors"] == hashlib.sha256(WEIGHTS).hexdigest()

    async def test_a_part_file_already_whole_is_checked_without_asking_the_hub_again(
        self, hub: Hub, root: Path
    ) -> None:
        part = root / INCOMING / "org" / "model" / COMMIT / ("model.safetensors" + PART)
        await asyncio.to_thread(part.parent.mkdir, parents=True)
        await asyncio.to_thread(part.write_bytes, WEIGHTS)
        async with _fetcher(hub, root) as fetcher:
            await fetcher.fetch("org/model", "main", ["model.safetensors"])
        assert hub.requests == []
        assert (root / "org" / "model" / COMMIT / "model.safetensors").read_bytes() == WEIGHTS

    async def test_a_connection_dropped_midway_is_resumed_within_the_same_fetch(
        self, hub: Hub, root: Path
    ) -> None:
        hub.cut_after = [len(WEIGHTS) // 2, len(WEIGHTS) // 4]
        async with _fetcher(hub, root, attempts=3) as fetcher:
            await fetcher.fetch("org/model", "main", ["model.safetensors"])
        first, *resumed = [r for _, _, r in hub.requests]
        assert first is None and len(resumed) == 2
        # Each try asks for the rest after what reached the disk (the hang-up may lose the last bytes sent).
        offsets = [int(r.removeprefix("bytes=").rstrip("-")) if r else 0 for r in resumed]
        assert (
            0 < offsets[0] <= len(WEIGHTS) // 2 and offsets[0] <= offsets[1] <= offsets[0] + len(WEIGHTS) // 4
        )
        assert (root / "org" / "model" / COMMIT / "model.safetensors").read_bytes() == WEIGHTS


class TestTokens:
    async def test_a_gated_repository_without_a_token_says_one_is_needed_and_where(
        self, hub: Hub, root: Path
    ) -> None:
        hub.gated = True
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(FetchError) as caught:
                await fetcher.fetch("org/model", "main")
        assert "the hub wants a token (HTTP 401)" in str(caught.value)
        assert "mirror.hf_token_file" in str(caught.value) and "HF_TOKEN" in str(caught.value)

    async def test_a_repository_whose_files_alone_are_gated_names_the_file_and_the_token_it_needs(
        self, hub: Hub, root: Path
    ) -> None:
        hub.gated_files_only = True
        async with _fetcher(hub, root) as fetcher:
            with pytest.raises(FetchError) as caught:
                await fetcher.fetch("org/model", "main")
        assert str(caught.value).startswith(
            "org/model@0123456789ab: config.json: the hub wants a token (HTTP 401)"
        )

    async def test_a_gated_repository_is_fetched_with_its_token_which_no_log_line_shows(
        self, hub: Hub, root: Path
    ) -> None:
        hub.gated = True
        hub.cut_after = [1000]
        with structlog.testing.capture_logs() as logs:
            async with _fetcher(hub, root, token=TOKEN) as fetcher:
                await fetcher.fetch("org/model", "main")
        assert set(hub.authorizations) == {f"Bearer {TOKEN}"}
        assert logs and TOKEN not in repr(logs)

    async def test_a_refused_token_is_not_repeated_in_the_error(self, hub: Hub, root: Path) -> None:
        hub.gated = True
        async with _fetcher(hub, root, token="hf_wrong_" + TOKEN) as fetcher:
            with pytest.raises(FetchError) as caught:
                await fetcher.fetch("org/model", "main")
        assert TOKEN not in str(caught.value)

    def test_the_token_comes_from_its_file_before_the_environment(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("HF_TOKEN", "from-env")
        token_file = tmp_path / "token"
        token_file.write_text("from-file\n")
        assert read_token(str(token_file)) == "from-file"
        assert read_token("") == "from-env"
        monkeypatch.delenv("HF_TOKEN")
        assert read_token("") is None

    def test_an_unreadable_or_empty_token_file_is_refused_naming_it(self, tmp_path: Path) -> None:
        with pytest.raises(FetchError, match=r"cannot read the hub's token from .*/absent"):
            read_token(str(tmp_path / "absent"))
        (tmp_path / "empty").write_text("\n")
        with pytest.raises(FetchError, match=r"empty\b.*is empty"):
            read_token(str(tmp_path / "empty"))


class TestServing:
    async def test_the_mirror_serves_a_fetched_model_but_not_its_bookkeeping(
        self, hub: Hub, root: Path
    ) -> None:
        import aiohttp

        hub.cut_after = [1000]
        async with _fetcher(hub, root, attempts=1) as fetcher:
            with pytest.raises(FetchError):
                await fetcher.fetch("org/model", "main", ["model.safetensors"])
            await fetcher.fetch("org/model", "main", ["*.json"])
        runner = web.AppRunner(await asyncio.to_thread(make_mirror_app, root), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}/files/"
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}org/model/{COMMIT}/") as listing:
                    paths = [f["path"] for f in (await listing.json())["files"]]
                async with http.get(f"{base}org/model/{COMMIT}/{MANIFEST}") as manifest:
                    manifest_status = manifest.status
                partial = f"{INCOMING}/org/model/{COMMIT}/model.safetensors{PART}"
                async with http.get(base + partial) as half:
                    partial_status = half.status
                async with http.get(f"{base}{INCOMING}/") as incoming:
                    incoming_status = incoming.status
        finally:
            await runner.cleanup()
        assert (root / partial).exists()
        assert paths == ["config.json", "tokenizer/tokenizer.json"]
        assert (manifest_status, partial_status, incoming_status) == (404, 404, 404)


class TestCommand:
    async def _run(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        src = str(Path(__file__).parent.parent.parent / "src")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llmgw",
            "mirror",
            "fetch",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": src, **(env or {})},
        )
        out, err = await process.communicate()
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    async def test_mirror_fetch_prints_progress_and_the_commit_it_fetched(
        self, hub: Hub, root: Path, tmp_path: Path
    ) -> None:
        hub.gated = True
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN)
        config = tmp_path / "mirror.yaml"
        config.write_text(
            json.dumps({"root": str(root), "hf_endpoint": hub.url, "hf_token_file": str(token_file)})
        )
        code, out, err = await self._run("org/model", "--include", "*.safetensors", "--config", str(config))
        assert code == 0, err
        assert f"fetched org/model@main (commit {COMMIT}): 1 files, 2.1 MB" in out
        assert f"/files/org/model/{COMMIT}/" in out
        assert "model.safetensors (1 of 1 files) 2.1 of 2.1 MB; in all 2.1 of 2.1 MB" in err
        assert TOKEN not in out + err

    async def test_mirror_fetch_fails_naming_the_file_and_why(self, hub: Hub, root: Path) -> None:
        hub.gone.add("config.json")
        code, _, err = await self._run(
            "org/model", "--root", str(root), "--endpoint", hub.url, env={"HF_TOKEN": ""}
        )
        assert code == 1
        assert "llmgw: org/model@0123456789ab: config.json: HTTP 404 at" in err
        assert "Traceback" not in err
