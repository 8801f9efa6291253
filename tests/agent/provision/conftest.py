"""A fake publisher and a fake machine for the installer's tests.

The publisher is a real aiohttp server on 127.0.0.1 serving a release shaped
like GitHub's API, with real archives built here and their sha256 digests.
The machine answers package tools, ldd and the engine through the
installer's command seam.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
import zipfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.installer import Installer, InstallStatus
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import CommandResult

UBUNTU = Host(
    os_id="ubuntu",
    os_version="24.04",
    os_codename="noble",
    id_like=("debian",),
    arch="amd64",
    cpu_flags=("avx", "avx2", "fma", "f16c"),
)
ROCKY = Host(
    os_id="rocky", os_version="10.0", id_like=("rhel", "centos", "fedora"), arch="amd64", cpu_flags=("avx2",)
)

CPU_ASSET = "llama-b1-bin-ubuntu-x64.tar.gz"


def tar_gz(files: Mapping[str, str | bytes], links: Mapping[str, str] | None = None) -> bytes:
    """A .tar.gz holding files (mode 0755) and symlinks, in that order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, body in files.items():
            data = body.encode() if isinstance(body, str) else body
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def zip_bytes(files: Mapping[str, str | bytes], links: Mapping[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, body in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100755) << 16
            zf.writestr(info, body)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def llama_cpu_archive() -> bytes:
    return tar_gz(
        {"llama-b1/llama-server": "#!/bin/sh\necho version: 1\n", "llama-b1/libllama.so.0": "x"},
        {"llama-b1/libllama.so": "libllama.so.0"},
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeRelease:
    """One publisher: releases by repo and tag, their assets and digests, and what was asked."""

    def __init__(self, assets: Mapping[str, bytes] | None = None) -> None:
        self.assets: dict[str, bytes] = dict(
            assets if assets is not None else {CPU_ASSET: llama_cpu_archive()}
        )
        self.digests: dict[str, str] = {name: f"sha256:{sha256(b)}" for name, b in self.assets.items()}
        self.tags = {"b1"}
        self.api_status = 200
        self.requests: list[str] = []
        # Set to hold every download until released.
        self.hold_downloads: asyncio.Event | None = None
        self.download_started = asyncio.Event()
        # Set to send only the first pause_after bytes of an asset until pause is set.
        self.pause_after = 0
        self.pause: asyncio.Event | None = None
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/repos/{owner}/{repo}/releases/tags/{tag}", self._release)
        app.router.add_get("/{prefix:.*}/releases/download/{tag}/{asset}", self._asset)
        return app

    async def _release(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        if self.api_status != 200:
            return web.Response(status=self.api_status)
        if request.match_info["tag"] not in self.tags:
            return web.Response(status=404)
        assets = [{"name": n, "digest": self.digests.get(n), "size": len(b)} for n, b in self.assets.items()]
        return web.json_response({"tag_name": request.match_info["tag"], "assets": assets})

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        body = self.assets.get(request.match_info["asset"])
        if body is None:
            return web.Response(status=404)
        self.download_started.set()
        if self.hold_downloads is not None:
            await self.hold_downloads.wait()
        if self.pause is None:
            return web.Response(body=body, content_type="application/octet-stream")
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: self.pause_after])
        await self.pause.wait()
        await response.write(body[self.pause_after :])
        await response.write_eof()
        return response

    def downloads(self) -> list[str]:
        return [p for p in self.requests if "/releases/download/" in p]

    def api_calls(self) -> list[str]:
        return [p for p in self.requests if p.startswith("/repos/")]


@pytest.fixture
async def release() -> AsyncIterator[FakeRelease]:
    fake = FakeRelease()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        for held in (fake.hold_downloads, fake.pause):
            if held is not None:
                held.set()
        await runner.cleanup()


@pytest.fixture
async def releases(release: FakeRelease) -> AsyncIterator[ReleaseClient]:
    async with ReleaseClient(api_url=release.url, download_url=release.url) as client:
        yield client


class FakeMachine:
    """Answers the package tools, ldd and the engine itself, as one machine would."""

    def __init__(self, installed: Sequence[str] = (), tools: Sequence[str] = ("apt-get",)) -> None:
        self.installed = set(installed)
        self.tools = set(tools)
        self.ldd_output = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6\n"
        self.version_output = "version: 10991 (abc123)\nbuilt with cc for x86_64-linux-gnu\n"
        # How many more package commands find the lock held.
        self.locked = 0
        self.lock_message = (
            "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1234 (apt-get)"
        )
        self.package_failure = ""
        self.calls: list[tuple[str, ...]] = []
        self.envs: list[Mapping[str, str] | None] = []

    async def which(self, program: str) -> str | None:
        return f"/usr/bin/{program}" if program in self.tools else None

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        self.envs.append(env)
        tool = argv[0]
        if tool == "dpkg-query":
            pkg = argv[-1]
            return CommandResult(0, "ii ") if pkg in self.installed else CommandResult(1, "")
        if tool == "rpm":
            pkg = argv[-1]
            ok = pkg in self.installed
            return CommandResult(0 if ok else 1, pkg if ok else f"package {pkg} is not installed")
        if tool in ("apt-get", "dnf", "yum", "zypper"):
            if tool not in self.tools:
                return CommandResult(127, f"{tool}: command not found")
            if self.locked > 0:
                self.locked -= 1
                return CommandResult(100, self.lock_message)
            if self.package_failure:
                return CommandResult(100, self.package_failure)
            if "install" in argv:
                after = argv[argv.index("install") + 1 :]
                self.installed.update(a for a in after if not a.startswith("-"))
            return CommandResult(0, "")
        if tool == "ldd":
            return CommandResult(0, self.ldd_output)
        if tool.endswith("/llama-server") and argv[1:] == ("--version",):
            return CommandResult(0, self.version_output)
        return CommandResult(127, f"{tool}: not something this machine expected to run")

    def package_commands(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] in ("apt-get", "dnf", "yum", "zypper")]


class Recorder:
    """Every status the installer reports, in order."""

    def __init__(self) -> None:
        self.seen: list[InstallStatus] = []

    def __call__(self, st: InstallStatus) -> None:
        self.seen.append(st)

    def details(self) -> list[str]:
        return [f"{s.state}: {s.detail}" for s in self.seen]


class Archives:
    """Builders for the archives a test serves, as a fixture (test modules cannot import conftest)."""

    tar_gz = staticmethod(tar_gz)
    zip_bytes = staticmethod(zip_bytes)
    llama_cpu_archive = staticmethod(llama_cpu_archive)
    sha256 = staticmethod(sha256)
    CPU_ASSET = CPU_ASSET
    UBUNTU = UBUNTU
    ROCKY = ROCKY
    FakeMachine = FakeMachine


@pytest.fixture
def kit() -> type[Archives]:
    return Archives


@pytest.fixture
def machine() -> FakeMachine:
    """An Ubuntu machine with apt-get and none of the build's packages."""
    return FakeMachine()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def installer_for(
    tmp_path: Path, machine: FakeMachine, releases: ReleaseClient, recorder: Recorder
) -> Callable[[Host], Installer]:
    def make(host: Host) -> Installer:
        return Installer(
            tmp_path / "engines",
            host,
            machine,
            releases,
            on_status=recorder,
            lock_retry_s=0.0,
            lock_wait_s=600.0,
        )

    return make


@pytest.fixture
def installer(installer_for: Callable[[Host], Installer]) -> Installer:
    """An installer on an Ubuntu x64 machine with AVX2 and no GPU."""
    return installer_for(UBUNTU)
