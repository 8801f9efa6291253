"""A model repository fetched from a Hugging Face–compatible hub into the mirror, pinned.

The hub's model-info route (`/api/models/REPO/revision/REV?blobs=true`) says
which commit a revision names and lists every file with its size and digests:
an LFS file's sha256 (`lfs.sha256`, or `lfs.oid`) and every file's git blob id
(`blobId`). Files are downloaded from `/REPO/resolve/COMMIT/PATH` — the
commit, never the branch, so a push during a long fetch cannot mix two
versions — into ROOT/.incoming/REPO/COMMIT/PATH.part, resumed with a Range
request when cut off, and each is checked against the hub's digest before it
is renamed. The model appears at ROOT/REPO/COMMIT/ only once every file is
there, with its pins in ROOT/REPO/COMMIT/.llmgw-model.json: a node never sees
half a model, and the mirror serves no name beginning with a dot.

Everything that touches the disk runs in a thread; hashing a 40 GB file takes
minutes, and the loop carries the mirror's other requests meanwhile.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import os
import shutil
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
import attrs
import cattrs
import structlog

from llmgw import download, durable, strictjson
from llmgw.backoff import ExponentialBackoff
from llmgw.download import PART, human_bytes
from llmgw.errors import LlmgwError
from llmgw.hubref import COMMIT_PATTERN

log = structlog.get_logger(__name__)

MANIFEST = ".llmgw-model.json"
INCOMING = ".incoming"
TOKEN_ENV = "HF_TOKEN"

_converter = cattrs.Converter()


class FetchError(LlmgwError):
    """A model that cannot be fetched; the message names the repository, the file and why."""


@attrs.frozen
class HubFile:
    """One file of a revision as the hub describes it."""

    path: str
    size: int | None
    # The LFS object's sha256: what a weights file is pinned by.
    sha256: str | None
    # git's id of the blob (sha1 of "blob SIZE\\0" + bytes): what a small file is checked by.
    blob_id: str | None


@attrs.frozen
class Snapshot:
    """What the hub says a revision holds: its commit and its files."""

    repo: str
    revision: str
    commit: str
    files: tuple[HubFile, ...]


@attrs.frozen
class FetchProgress:
    """How far a fetch has come, per file and in total (None where the hub gave no size)."""

    repo: str
    commit: str
    file: str
    file_number: int
    files: int
    file_done: int
    file_size: int | None
    done: int
    total: int | None

    def describe(self) -> str:
        """ "org/model@1a2b3c4d5e6f: model.safetensors (2 of 5 files) 1.2 of 4.1 GB; in all 1.3 of 4.5 GB"."""
        return (
            f"{self.repo}@{self.commit[:12]}: {self.file} ({self.file_number} of {self.files} files) "
            f"{human_bytes(self.file_done, self.file_size)}; in all {human_bytes(self.done, self.total)}"
        )


@attrs.frozen
class FetchedFile:
    path: str
    size: int
    sha256: str
    blob_id: str | None = None


@attrs.frozen
class FetchedModel:
    """A model on the mirror: what ROOT/REPO/COMMIT/.llmgw-model.json holds."""

    repo: str
    revision: str
    commit: str
    files: list[FetchedFile]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def pins(self) -> dict[str, str]:
        """path -> sha256 of every file: what a node checks its copy against."""
        return {f.path: f.sha256 for f in self.files}


Progress = Callable[[FetchProgress], None]


def read_token(token_file: str) -> str | None:
    """The hub's token from token_file, else from HF_TOKEN; None when neither has one.

    Blocking (it reads a file): call it in a thread, or before the loop starts.
    """
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise FetchError(f"cannot read the hub's token from {token_file}: {exc.strerror}") from None
        if not token:
            raise FetchError(f"{token_file} is empty; it should hold the hub's access token")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def model_dir(root: Path, repo: str, commit: str) -> Path:
    return root / repo / commit


def read_model(directory: Path) -> FetchedModel | None:
    """The model whose manifest is in directory; None when there is none. Blocking: call it in a thread."""
    try:
        data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        return _converter.structure(data, FetchedModel)
    except (OSError, ValueError, cattrs.BaseValidationError):
        return None


class HubFetcher:
    """Downloads from one hub into one mirror directory; `async with` closes its HTTP session."""

    def __init__(
        self,
        root: Path,
        endpoint: str,
        token: str | None,
        *,
        attempts: int = 5,
        retry_base_s: float = 1.0,
    ) -> None:
        self.root = root
        self.endpoint = endpoint.rstrip("/")
        # Kept out of every message and log line: it is only ever put in a request's header.
        self._token = token
        self._retries = download.Retries(attempts, ExponentialBackoff(base_s=retry_base_s))
        # No total timeout: a 40 GB file takes as long as it takes. A stalled one is caught by sock_read.
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=60))
        # One fetch per commit at a time: two would write the same .part files.
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def __aenter__(self) -> HubFetcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def snapshot(self, repo: str, revision: str) -> Snapshot:
        """The commit revision names and its files, from the hub's model-info route."""
        url = (
            f"{self.endpoint}/api/models/{urllib.parse.quote(repo)}/revision/"
            f"{urllib.parse.quote(revision, safe='')}?blobs=true"
        )
        try:
            async with self._session.get(url, headers=self._headers()) as response:
                if response.status != 200:
                    raise self._refusal(response.status, response.headers, f"{repo}@{revision}", revision)
                info = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise FetchError(
                f"cannot reach the hub at {self.endpoint} for {repo}@{revision}: {exc or type(exc).__name__}"
            ) from None
        except ValueError:
            raise FetchError(f"the hub at {self.endpoint} answered {repo}@{revision} with no JSON") from None
        return _snapshot_of(info, repo, revision, self.endpoint)

    def _refusal(self, status: int, headers: Mapping[str, str], what: str, revision: str) -> FetchError:
        code = headers.get("X-Error-Code", "")
        if code == "GatedRepo" or (status in (401, 403) and self._token is None):
            return FetchError(
                f"{what}: the hub wants a token (HTTP {status}): the repository is gated or "
                f"private; put one in the file mirror.hf_token_file names, or in {TOKEN_ENV}, "
                "from an account that has been granted access"
            )
        if status in (401, 403):
            return FetchError(
                f"{what}: the hub refused the token (HTTP {status}); "
                "its account may not have been granted access to this repository"
            )
        if code == "RevisionNotFound":
            return FetchError(f"{what}: the repository has no revision {revision!r}")
        if status == 404:
            return FetchError(f"{what}: no such repository or revision on {self.endpoint} (HTTP 404)")
        return FetchError(f"{what}: the hub at {self.endpoint} answered HTTP {status}")

    async def fetch(
        self, repo: str, revision: str, include: Sequence[str] = (), progress: Progress | None = None
    ) -> FetchedModel:
        """Download repo at revision (the files include's globs match; all when none) into the mirror."""
        snapshot = await self.snapshot(repo, revision)
        wanted = _selected(snapshot, include)
        key = (repo, snapshot.commit)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            try:
                return await self._fetch(snapshot, wanted, progress)
            except OSError as exc:
                # A full disk or a root that cannot be written: the operator's to fix, said in words.
                where = exc.filename or self.root
                raise FetchError(
                    f"{repo}@{snapshot.commit[:12]}: cannot write {where}: {exc.strerror or exc}"
                ) from None

    async def _fetch(
        self, snapshot: Snapshot, wanted: list[HubFile], progress: Progress | None
    ) -> FetchedModel:
        repo, commit = snapshot.repo, snapshot.commit
        final = model_dir(self.root, repo, commit)
        staging = self.root / INCOMING / repo / commit
        held = await asyncio.to_thread(read_model, final)
        kept = {f.path: f for f in held.files} if held is not None else {}
        # A file already on the mirror with the hub's digest is not downloaded again.
        missing = [f for f in wanted if not _same(kept.get(f.path), f)]
        sizes = [f.size for f in missing]
        total = None if None in sizes else sum(size for size in sizes if size is not None)
        done = 0
        fetched: list[FetchedFile] = []
        for number, f in enumerate(missing, 1):
            report = _Reporter(progress, repo, commit, f.path, number, len(missing), done, total)
            fetched.append(await self._file(snapshot, f, staging, report))
            done += fetched[-1].size
        now = {f.path: f for f in fetched}
        files = sorted({**kept, **now}.values(), key=_path)
        model = FetchedModel(repo=repo, revision=snapshot.revision, commit=commit, files=files)
        await asyncio.to_thread(place_model, self.root, staging, final, model, [f.path for f in fetched])
        log.info("model fetched", repo=repo, commit=commit, files=len(model.files), bytes=model.size)
        return model

    async def _file(
        self,
        snapshot: Snapshot,
        f: HubFile,
        staging: Path,
        report: _Reporter,
    ) -> FetchedFile:
        """One file into staging, downloaded or resumed, checked against the hub's digests."""
        what = f"{snapshot.repo}@{snapshot.commit[:12]}: {f.path}"
        target = staging / f.path
        staged = await asyncio.to_thread(_digest_if_size, target, f.size)
        if staged is not None:
            digest, size = staged
        else:
            url = (
                f"{self.endpoint}/{urllib.parse.quote(snapshot.repo)}/resolve/{snapshot.commit}/"
                f"{urllib.parse.quote(f.path)}"
            )
            got = await self._download(what, url, target.with_name(target.name + PART), f, report)
            digest, size = got.sha256, got.size
        part = target.with_name(target.name + PART)
        why = await asyncio.to_thread(_mismatch, part if staged is None else target, f, digest, size)
        if why is not None:
            await asyncio.to_thread(_unlink, part if staged is None else target)
            raise FetchError(f"{what}: {why}; the download was removed, and the next fetch starts it over")
        if staged is None:
            await asyncio.to_thread(durable.move_into_place, part, target)
        report(size, f.size if f.size is not None else size)
        return FetchedFile(path=f.path, size=size, sha256=digest, blob_id=f.blob_id)

    async def _download(
        self, what: str, url: str, part: Path, f: HubFile, report: _Reporter
    ) -> download.Downloaded:
        try:
            return await download.fetch(
                self._session,
                url,
                part,
                retries=self._retries,
                size=f.size,
                sha256=f.sha256,
                headers=self._headers(),
                progress=report,
            )
        except download.Refused as exc:
            if exc.status in (401, 403):
                raise self._refusal(exc.status, exc.headers, what, "") from None
            raise FetchError(f"{what}: {exc}") from None
        except download.Mismatch as exc:
            why = (
                f"{exc.got} bytes where the hub says {exc.expected}"
                if exc.what == "size"
                else f"sha256 does not match the hub's (expected {exc.expected}, got {exc.got})"
            )
            raise FetchError(
                f"{what}: {why}; the download was removed, and the next fetch starts it over"
            ) from None
        except download.DownloadError as exc:
            raise FetchError(f"{what}: {exc}") from None


@attrs.frozen
class _Reporter:
    """Tells progress how far one file of a fetch has come, and the whole fetch with it."""

    progress: Progress | None
    repo: str
    commit: str
    path: str
    number: int
    files: int
    done_before: int
    total: int | None

    def __call__(self, file_done: int, file_size: int | None) -> None:
        if self.progress is None:
            return
        self.progress(
            FetchProgress(
                repo=self.repo,
                commit=self.commit,
                file=self.path,
                file_number=self.number,
                files=self.files,
                file_done=file_done,
                file_size=file_size,
                done=self.done_before + file_done,
                total=self.total,
            )
        )


def _path(f: FetchedFile) -> str:
    return f.path


def _snapshot_of(info: Any, repo: str, revision: str, endpoint: str) -> Snapshot:
    """The hub's model-info answer as a Snapshot; FetchError when it is not one."""
    try:
        commit = str(info["sha"])
        siblings = info["siblings"]
        files = []
        for entry in siblings:
            path = str(entry["rfilename"])
            lfs = entry.get("lfs") or {}
            sha256 = lfs.get("sha256") or lfs.get("oid")
            size = lfs.get("size", entry.get("size"))
            files.append(
                HubFile(
                    path=path,
                    size=int(size) if size is not None else None,
                    sha256=str(sha256).lower() if sha256 else None,
                    blob_id=str(entry["blobId"]).lower() if entry.get("blobId") else None,
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise FetchError(
            f"{repo}@{revision}: the hub at {endpoint} did not answer with a model's files "
            '({"sha": ..., "siblings": [{"rfilename": ...}]})'
        ) from None
    if not COMMIT_PATTERN.fullmatch(commit):
        raise FetchError(
            f"{repo}@{revision}: the hub named {commit!r} as its commit, which is not a commit hash"
        )
    for f in files:
        parts = PurePosixPath(f.path).parts
        if not parts or f.path.startswith("/") or ".." in parts or "\\" in f.path:
            raise FetchError(
                f"{repo}@{revision}: the hub lists {f.path!r}, which is not a path inside the repository"
            )
    return Snapshot(repo=repo, revision=revision, commit=commit, files=tuple(files))


def _selected(snapshot: Snapshot, include: Sequence[str]) -> list[HubFile]:
    """The files to fetch: include's globs (all when none), never a name beginning with a dot.

    .gitattributes and the like belong to the repository, not the model, and the
    mirror serves no dotted name (it keeps its own bookkeeping under such names).
    """
    files = [f for f in snapshot.files if not any(p.startswith(".") for p in PurePosixPath(f.path).parts)]
    if include:
        files = [f for f in files if any(fnmatch.fnmatchcase(f.path, glob) for glob in include)]
    if not files:
        has = ", ".join(f.path for f in snapshot.files[:8]) + (", …" if len(snapshot.files) > 8 else "")
        globs = " ".join(f"--include {g!r}" for g in include)
        raise FetchError(
            f"{snapshot.repo}@{snapshot.revision}: no file to fetch"
            + (f" matches {globs}" if include else "")
            + f" (it has: {has or 'nothing'})"
        )
    return files


def _same(held: FetchedFile | None, f: HubFile) -> bool:
    if held is None or (f.size is not None and held.size != f.size):
        return False
    if f.sha256 is not None:
        return held.sha256 == f.sha256
    return f.blob_id is not None and held.blob_id == f.blob_id


def _mismatch(path: Path, f: HubFile, sha256: str, size: int) -> str | None:
    """Why the downloaded file is not the one the hub described; None when it is. Blocking."""
    if f.size is not None and size != f.size:
        return f"{size} bytes where the hub says {f.size}"
    if f.sha256 is not None:
        if sha256 != f.sha256:
            return f"sha256 does not match the hub's (expected {f.sha256}, got {sha256})"
        return None
    if f.blob_id is not None:
        blob = _git_blob_id(path, size)
        if blob != f.blob_id:
            return f"git blob id does not match the hub's (expected {f.blob_id}, got {blob})"
    return None


def _git_blob_id(path: Path, size: int) -> str:
    hasher = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    download.hash_prefix(path, hasher)
    return hasher.hexdigest()


def _digest_if_size(path: Path, size: int | None) -> tuple[str, int] | None:
    """(sha256, size) of a file an earlier fetch staged; None when there is none. Blocking.

    Hashed again rather than trusted: it is checked against the hub like a fresh download.
    """
    if not path.is_file() or (size is not None and download.size_on_disk(path) != size):
        return None
    hasher = hashlib.sha256()
    have = download.hash_prefix(path, hasher)
    return hasher.hexdigest(), have


def place_model(root: Path, staging: Path, final: Path, model: FetchedModel, fetched: list[str]) -> None:
    """Put the checked files where the mirror serves them, the manifest last. Blocking.

    File by file, never the staging directory whole: it may hold another file's .part
    from an earlier fetch with other --include globs, which must not be served.
    """
    final.mkdir(parents=True, exist_ok=True)
    for path in fetched:
        (final / path).parent.mkdir(parents=True, exist_ok=True)
        durable.move_into_place(staging / path, final / path)
    _write_manifest(final, model)
    # The directories the staging left behind empty (one still holding a .part stays).
    for path in fetched:
        for parent in (staging / path).parents:
            if parent == root / INCOMING:
                break
            try:
                parent.rmdir()
            except OSError:
                break


def _write_manifest(directory: Path, model: FetchedModel) -> None:
    durable.write_atomically(
        directory / MANIFEST, strictjson.dumps(_converter.unstructure(model), indent=1) + "\n"
    )


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def list_models(root: Path) -> list[FetchedModel]:
    """Every model fetched into root (those with a manifest), by repository and commit. Blocking."""
    found = []
    for manifest in sorted(root.glob(f"**/{MANIFEST}")):
        if manifest.relative_to(root).parts[0] == INCOMING:
            continue
        model = read_model(manifest.parent)
        if model is not None and manifest.parent == model_dir(root, model.repo, model.commit):
            found.append(model)
    return found


def find_model(root: Path, repo: str, revision: str) -> FetchedModel | None:
    """The model of repo that revision names on the mirror: its commit, or the revision it was fetched as.

    Blocking. Of several commits fetched as the same branch, the one fetched last.
    """
    if COMMIT_PATTERN.fullmatch(revision):
        return read_model(model_dir(root, repo, revision))
    fetched = [
        (manifest.stat().st_mtime, model)
        for manifest in (root / repo).glob(f"*/{MANIFEST}")
        if (model := read_model(manifest.parent)) is not None and model.revision == revision
    ]
    return max(fetched, key=lambda pair: pair[0])[1] if fetched else None


def remove_model(root: Path, repo: str, commit: str) -> None:
    """Delete repo's commit from the mirror: the manifest first, so no half-deleted model is served."""
    directory = model_dir(root, repo, commit)
    (directory / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)
    for parent in directory.parents:
        if parent == root:
            break
        try:
            parent.rmdir()
        except OSError:
            break
