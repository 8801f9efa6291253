"""Bringing each wanted engine to a build that is installed and seen to run.

One directory per build, `<root>/<engine>/<version>-<variant>`, holding a
marker file once the build has been fetched, checked against its checksum,
unpacked, and run. Its absence means the directory is not to be trusted. A
build is unpacked into `<dir>.partial` and renamed into place only at the
end, so an install that is interrupted leaves nothing that looks installed.

An installed build is checked again on every pass rather than believed: an
unrelated upgrade can remove a library it needs, and that is found here
rather than by the next replica to start on the node.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs
import structlog

from llmgw.agent.discovery.host import Host
from llmgw.agent.provision import ldd
from llmgw.agent.provision.archive import unpack
from llmgw.agent.provision.packages import ensure_packages
from llmgw.agent.provision.place import fresh_dirs, put_in_place, read_marker, remove_dirs
from llmgw.agent.provision.recipes import RECIPES, cannot_install
from llmgw.agent.provision.release import ReleaseClient
from llmgw.agent.provision.runner import CommandResult, CommandRunner
from llmgw.agent.provision.transfer import STALL_S, DownloadReport
from llmgw.agent.provision.wheels import EnvInstall, WheelSource, install_env, lock_digest, recheck
from llmgw.engines.base import Build, Recipe, UnsupportedError, WheelRecipe, Wheels
from llmgw.errors import LlmgwError
from llmgw.proto.llmgw import v1 as pb

log = structlog.get_logger(__name__)

INSTALLING: Final = "installing"
READY: Final = "ready"
FAILED: Final = "failed"
UNSUPPORTED: Final = "unsupported"

# Release tags become paths and URLs; anything else is refused before it can
# name a directory outside the root.
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


class InstallError(LlmgwError):
    """An install that cannot finish; the message is the status's detail."""


@attrs.frozen
class Want:
    """One engine at one version."""

    engine: str
    version: str


@attrs.frozen
class Source:
    """Where archives and their checksums come from when not from the publisher.

    An offline cluster's mirror, with checksums the control plane holds: when
    set, the publisher is never asked.
    """

    base_url: str = ""
    # Asset name -> "sha256:<hex>".
    checksums: Mapping[str, str] = attrs.field(factory=dict)
    # Where pip takes an engine's wheels from, for an engine installed with pip.
    wheels: WheelSource = attrs.field(factory=WheelSource)

    @property
    def replaces_publisher(self) -> bool:
        return bool(self.base_url or self.checksums)


@attrs.frozen
class InstallStatus:
    """Where one engine's installation stands."""

    engine: str
    version: str
    state: str
    # For a person: what is happening, or what went wrong.
    detail: str
    variant: str = ""
    # The executable, once ready.
    binary: str = ""

    def to_proto(self) -> pb.ProvisionStatus:
        return pb.ProvisionStatus(
            engine=self.engine,
            version=self.version,
            variant=self.variant,
            state=self.state,
            detail=self.detail,
        )


class Installer:
    """Installs engines under one directory, reporting every step through on_status."""

    def __init__(
        self,
        root: Path,
        host: Host,
        runner: CommandRunner,
        releases: ReleaseClient,
        *,
        on_status: Callable[[InstallStatus], None] | None = None,
        recipes: Mapping[str, Recipe | WheelRecipe] = RECIPES,
        lock_retry_s: float = 10.0,
        lock_wait_s: float = 600.0,
        version_timeout_s: float = 60.0,
        download_stall_s: float = STALL_S,
    ) -> None:
        self.root = root
        self.host = host
        self.runner = runner
        self.releases = releases
        self.on_status = on_status
        self.recipes = recipes
        self.lock_retry_s = lock_retry_s
        self.lock_wait_s = lock_wait_s
        self.version_timeout_s = version_timeout_s
        self.download_stall_s = download_stall_s

    async def converge(self, wants: Sequence[Want], source: Source | None = None) -> list[InstallStatus]:
        """Bring every wanted engine to ready, or say why it cannot be."""
        out = []
        for want in wants:
            st = await self._one(want, source or Source())
            self._report(st)
            out.append(st)
        return out

    def _report(self, st: InstallStatus) -> None:
        if self.on_status is not None:
            self.on_status(st)

    async def _one(self, want: Want, source: Source) -> InstallStatus:
        recipe = self.recipes.get(want.engine)
        if recipe is None:
            return InstallStatus(want.engine, want.version, UNSUPPORTED, cannot_install(want.engine))
        if not _VERSION.fullmatch(want.version):
            return InstallStatus(
                want.engine, want.version, FAILED, f"{want.version!r} is not a release name of {want.engine}"
            )
        if isinstance(recipe, WheelRecipe):
            return await self._one_env(recipe, want, source)
        try:
            build = recipe.choose(want.version, self.host)
        except UnsupportedError as exc:
            return InstallStatus(want.engine, want.version, UNSUPPORTED, str(exc))
        job = _Job(self, want, build)
        directory = self.root / want.engine / f"{want.version}-{build.variant}"
        try:
            marker = await asyncio.to_thread(read_marker, directory, want.engine, want.version, build.variant)
            if marker is not None:
                # The packages too: removing one is exactly what an unrelated
                # upgrade does, and ldd would then name only a library, not
                # which package held it.
                await self._packages(build, job)
                try:
                    binary, version = await self._verify(directory, build, marker.get("binary"))
                    return job.ready(binary, version)
                except InstallError as exc:
                    log.warning(
                        "an installed engine no longer runs; installing it again",
                        engine=want.engine,
                        version=want.version,
                        variant=build.variant,
                        reason=str(exc),
                    )
            binary, version = await self._install(recipe, want, build, directory, source, job)
            return job.ready(binary, version)
        except LlmgwError as exc:
            return job.failed(str(exc))
        except OSError as exc:
            where = exc.filename or self.root
            return job.failed(f"cannot write the install under {where}: {exc.strerror or exc}")

    async def _one_env(self, recipe: WheelRecipe, want: Want, source: Source) -> InstallStatus:
        """An engine installed with pip: its environment rechecked, or made from its lock."""
        try:
            wheels = recipe.choose(want.version, self.host)
        except UnsupportedError as exc:
            return InstallStatus(want.engine, want.version, UNSUPPORTED, str(exc))
        job = _Job(self, want, wheels)
        env = EnvInstall(
            wheels=wheels,
            directory=self.root / want.engine / f"{want.version}-{wheels.variant}",
            label=f"{recipe.title} {want.version} ({wheels.variant})",
            engine=want.engine,
            version=want.version,
            arch=self.host.arch,
        )
        try:
            marker = await asyncio.to_thread(
                read_marker, env.directory, want.engine, want.version, wheels.variant
            )
            # A lock that changed under the same version (a fixed pin in a newer llmgw) is a new install.
            if marker is not None and marker.get("lock") == await asyncio.to_thread(lock_digest, wheels.lock):
                try:
                    version = await recheck(self.runner, env.directory, wheels)
                    return job.ready(env.directory / wheels.binary, version)
                except LlmgwError as exc:
                    log.warning(
                        "an installed engine no longer imports; installing it again",
                        engine=want.engine,
                        version=want.version,
                        variant=wheels.variant,
                        reason=str(exc),
                    )
            version = await install_env(self.runner, env, source.wheels, job.progress)
        except UnsupportedError as exc:
            return InstallStatus(want.engine, want.version, UNSUPPORTED, str(exc), variant=wheels.variant)
        except LlmgwError as exc:
            return job.failed(str(exc))
        except OSError as exc:
            where = exc.filename or self.root
            return job.failed(f"cannot write the install under {where}: {exc.strerror or exc}")
        log.info("installed an engine", engine=want.engine, version=want.version, variant=wheels.variant)
        return job.ready(env.directory / wheels.binary, version)

    async def _packages(self, build: Build, job: _Job) -> None:
        await ensure_packages(
            self.runner,
            self.host,
            build.packages,
            job.progress,
            lock_retry_s=self.lock_retry_s,
            lock_wait_s=self.lock_wait_s,
        )

    async def _checksums(self, recipe: Recipe, want: Want, source: Source, job: _Job) -> dict[str, str]:
        if source.replaces_publisher:
            sums: dict[str, str] = {}
            for asset, digest in source.checksums.items():
                algo, _, hexsum = digest.partition(":")
                if algo == "sha256" and hexsum:
                    sums[asset] = hexsum.lower()
            return sums
        job.progress(f"asking the publisher for the checksums of {want.engine} {want.version}")
        return await self.releases.digests(recipe.repo, want.version)

    async def _install(
        self, recipe: Recipe, want: Want, build: Build, directory: Path, source: Source, job: _Job
    ) -> tuple[Path, str]:
        await self._packages(build, job)
        sums = await self._checksums(recipe, want, source, job)
        # A mirror with no checksums still speaks for the control plane: the
        # publisher was never asked, and saying it was sends someone to GitHub.
        who = "the control plane" if source.replaces_publisher else "its publisher"
        partial = directory.with_name(directory.name + ".partial")
        downloads = directory.with_name(directory.name + ".download")
        await asyncio.to_thread(fresh_dirs, partial, downloads)
        try:
            got: dict[str, str] = {}
            for asset in build.assets:
                expected = sums.get(asset)
                if expected is None:
                    # Refused rather than installed unchecked: this is a binary
                    # that runs, often as root, on every node.
                    raise InstallError(
                        f"{who} gives no checksum for {asset}, so it cannot be verified and is not installed"
                    )
                archive = downloads / asset
                url = self.releases.asset_url(recipe.repo, want.version, asset, source.base_url)
                with DownloadReport(asset, job.progress, self.download_stall_s) as report:
                    digest = await self.releases.download(url, archive, progress=report)
                if digest != expected:
                    raise InstallError(
                        f"{asset} does not match the checksum {who} gave "
                        f"(got {digest[:12]}, expected {expected[:12]}); it was not installed"
                    )
                job.progress(f"unpacking {asset}")
                try:
                    await asyncio.to_thread(unpack, archive, partial)
                except LlmgwError as exc:
                    raise InstallError(f"{asset} was refused: {exc}") from None
                await asyncio.to_thread(archive.unlink)
                got[asset] = f"sha256:{digest}"
            job.progress(f"checking that {build.binary} runs")
            binary, version = await self._verify(partial, build, None)
            relative = binary.relative_to(partial).as_posix()
            marker = {
                "engine": want.engine,
                "version": want.version,
                "variant": build.variant,
                "binary": relative,
                "sha256": got,
                "installed": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            }
            await asyncio.to_thread(put_in_place, partial, directory, marker)
        finally:
            await asyncio.to_thread(remove_dirs, partial, downloads)
        log.info(
            "installed an engine",
            engine=want.engine,
            version=want.version,
            variant=build.variant,
            dir=str(directory),
        )
        return directory / relative, version

    async def _verify(self, directory: Path, build: Build, relative: object) -> tuple[Path, str]:
        """Find the binary and run it: ldd first, then --version.

        Two checks because they fail differently. ldd names a missing library
        outright where running the binary only says it could not start; and
        running it is the only proof the rest (instruction set, driver) is there.
        """
        binary = await asyncio.to_thread(_find_binary, directory, build.binary, relative)
        if binary is None:
            raise InstallError(f"the build has no {build.binary} in it")
        res = await self.runner.run(["ldd", str(binary)], timeout_s=60.0)
        unmet = ldd.unmet(res.output)
        if unmet:
            raise InstallError(f"{build.binary} cannot run on this system: {'; '.join(unmet)}")
        res = await self.runner.run([str(binary), "--version"], timeout_s=self.version_timeout_s)
        if not res.ok:
            raise InstallError(f"{build.binary} --version {_how(res)}")
        return binary, _version_line(res.output)


class _Job:
    """One engine's install under way: reports each step as it starts."""

    def __init__(self, installer: Installer, want: Want, build: Build | Wheels) -> None:
        self._installer = installer
        self._want = want
        self._build = build

    def _status(self, state: str, detail: str, binary: str = "") -> InstallStatus:
        w = self._want
        return InstallStatus(w.engine, w.version, state, detail, variant=self._build.variant, binary=binary)

    def progress(self, detail: str) -> None:
        self._installer._report(self._status(INSTALLING, detail))

    def failed(self, detail: str) -> InstallStatus:
        return self._status(FAILED, detail)

    def ready(self, binary: Path, version: str) -> InstallStatus:
        # An environment's version says what it is ("vllm 0.32.0"); a binary's is only a number.
        shown = self._build.binary if isinstance(self._build, Build) else ""
        detail = f"{shown} {version}".strip()
        lacks = [f for f in self._build.cpu_flags if not self._installer.host.has_cpu_flag(f)]
        if lacks:
            # On every report, not once in a log: it is the difference between
            # five tokens a second and forty, and a VM on QEMU's default CPU
            # model looks healthy in every other way.
            detail += (
                f"; this CPU lacks {', '.join(lacks)}, so it will run several times slower "
                '(a VM needs CPU type "host")'
            )
        return self._status(READY, detail, str(binary))


def _how(res: CommandResult) -> str:
    how = "did not finish in time" if res.timed_out else f"failed (exit {res.returncode})"
    last = res.last_line()
    return f"{how}: {last}" if last else how


def _version_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if "version" in line.lower():
            return line
    return lines[0] if lines else ""


def _find_binary(directory: Path, name: str, relative: object) -> Path | None:
    if isinstance(relative, str) and relative:
        candidate = (directory / relative).resolve()
        if candidate.is_relative_to(directory.resolve()) and candidate.is_file():
            return directory / relative
    for dirpath, _dirnames, filenames in os.walk(directory):
        if name in filenames:
            return Path(dirpath) / name
    return None
