"""A publisher's releases: the checksums it gives each asset, and the assets.

Shaped on GitHub's release API, which is where llama.cpp publishes: the
checksums come from `GET {api}/repos/{repo}/releases/tags/{tag}`, whose
`assets[].digest` reads "sha256:<hex>", and the archives from
`{download}/{repo}/releases/download/{tag}/{asset}`. An offline mirror keeps
the same paths under its own address.

Downloads go through llmgw/download.py: written and hashed in a thread, a
chunk at a time, so a gigabyte of CUDA runtime never holds up a heartbeat,
and resumed when cut off.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp

from llmgw import download
from llmgw.backoff import ExponentialBackoff
from llmgw.errors import LlmgwError

GITHUB_API = "https://api.github.com"
GITHUB_DOWNLOADS = "https://github.com"


class ReleaseError(LlmgwError):
    """A release or an asset that could not be had, said for a person."""


class ReleaseClient:
    """Reads release checksums and downloads assets over one pooled HTTP session.

    Usable as `async with`; a session passed in stays the caller's to close.
    """

    def __init__(
        self,
        api_url: str = GITHUB_API,
        download_url: str = GITHUB_DOWNLOADS,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = 1800.0,
        attempts: int = 3,
        retry_base_s: float = 1.0,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.download_url = download_url.rstrip("/")
        self._session = session
        self._owns_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=30)
        self._retries = download.Retries(attempts, ExponentialBackoff(base_s=retry_base_s))

    async def __aenter__(self) -> ReleaseClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def digests(self, repo: str, tag: str) -> dict[str, str]:
        """Asset name -> sha256 hex, for the assets the publisher gives a digest for."""
        url = f"{self.api_url}/repos/{repo}/releases/tags/{quote(tag)}"
        where = urlsplit(self.api_url).netloc or self.api_url
        headers = {"Accept": "application/vnd.github+json"}
        try:
            async with self._http().get(url, headers=headers) as resp:
                if resp.status == 404:
                    raise ReleaseError(f"{repo} has no release {tag}")
                if resp.status in (403, 429):
                    # Sixty unauthenticated requests an hour per address, and a
                    # whole fleet behind one NAT shares them.
                    raise ReleaseError(
                        f"{where} is rate-limiting this address (HTTP {resp.status}); "
                        "the install is tried again later"
                    )
                if resp.status != 200:
                    raise ReleaseError(f"{where} answered HTTP {resp.status} for {repo} {tag}")
                body: Any = await resp.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise ReleaseError(f"cannot reach {where} for {repo} {tag}: {exc}") from None
        except ValueError:
            raise ReleaseError(f"{where} sent something that is not a release for {repo} {tag}") from None
        out: dict[str, str] = {}
        assets = body.get("assets") if isinstance(body, dict) else None
        for asset in assets if isinstance(assets, list) else []:
            if not isinstance(asset, dict):
                continue
            name, digest = asset.get("name"), asset.get("digest")
            if isinstance(name, str) and isinstance(digest, str):
                algo, _, hexsum = digest.partition(":")
                if algo == "sha256" and _is_sha256(hexsum):
                    out[name] = hexsum.lower()
        return out

    def asset_url(self, repo: str, tag: str, asset: str, base_url: str = "") -> str:
        """Where an asset is downloaded from: the publisher, or a mirror at base_url."""
        base = base_url.rstrip("/") if base_url else self.download_url
        return f"{base}/{repo}/releases/download/{quote(tag)}/{quote(asset)}"

    async def download(
        self,
        url: str,
        dest: Path,
        *,
        on_size: Callable[[int | None], None] | None = None,
        progress: download.Progress | None = None,
    ) -> str:
        """Fetch url into dest and return its sha256; on_size hears the length once known, progress
        (bytes on disk, the length) every chunk.

        Through the one resumable download (llmgw/download.py): a gigabyte of CUDA runtime cut
        off midway is resumed from what reached dest, not fetched again from its first byte.
        """
        name = url.rsplit("/", 1)[-1]
        where = urlsplit(url).netloc or url
        told: list[int | None] = []
        # (bytes on disk, the length): fetch tells where each try starts, received every chunk after.
        at: list[int | None] = [0, None]

        def started(done: int, size: int | None) -> None:
            at[:] = [done, size]
            if on_size is not None and not told:
                told.append(size)
                on_size(size)
            if progress is not None:
                progress(done, size)

        def received(n: int) -> None:
            done = (at[0] or 0) + n
            at[0] = done
            if progress is not None:
                progress(done, at[1])

        try:
            got = await download.fetch(
                self._http(), url, dest, retries=self._retries, progress=started, received=received
            )
        except download.Refused as exc:
            if exc.status == 404:
                # A mirror missing one archive of a release looks like this too.
                raise ReleaseError(
                    f"{where} has no {name} (HTTP 404): that release does not exist there"
                ) from None
            if exc.status in (403, 429):
                raise ReleaseError(
                    f"{where} is rate-limiting this address (HTTP {exc.status}) "
                    f"while downloading {name}; the install is tried again later"
                ) from None
            raise ReleaseError(f"downloading {name}: {where} answered HTTP {exc.status}") from None
        except download.DownloadError as exc:
            raise ReleaseError(f"downloading {name}: {exc}") from None
        return got.sha256


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)
