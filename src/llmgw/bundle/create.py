"""`llmgw bundle create`: what a cluster would download, collected into one checked piece.

A site with no route to the internet gets, from a machine that has one:
llmgw's wheel and its dependencies, the engines' release archives for each
architecture (checked against the publisher's digests, as a node's installer
checks them), and the model files pinned to a commit (checked against the
hub's digests, by the mirror's own fetch). The manifest lists every file with
its sha256 and size; its own sha256 is what is carried apart.

Built in OUT.partial and renamed at the end, so a create that fails midway
never leaves something that looks like a bundle.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import os
import re
import shutil
import sys
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from llmgw import __version__, durable
from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.recipes import RECIPES
from llmgw.agent.provision.release import ReleaseClient
from llmgw.bundle.manifest import (
    ENGINES,
    FORMAT,
    MANIFEST,
    MODELS,
    WHEELS,
    BundleEngine,
    BundleError,
    BundleFile,
    BundleModel,
    Kind,
    Manifest,
    digest,
)
from llmgw.bundle.wheelhouse import (
    HOST_ARCH,
    PIP_PLATFORMS,
    check_locked,
    download_wheelhouses,
    run_pip,
    wheel_recipe,
)
from llmgw.engines.base import Recipe, UnsupportedError
from llmgw.hubref import parse_ref
from llmgw.installed import Origin
from llmgw.mirror.fetch import INCOMING, FetchProgress, HubFetcher
from llmgw.mirror.fetch import MANIFEST as PINS

ARCHES = ("x64", "arm64")
_READ = 8 << 20
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
Report = Callable[[str], None]


@attrs.frozen
class CreateOptions:
    out: Path
    models: tuple[str, ...] = ()
    # Engine -> version ("llamacpp" -> "b11434").
    engines: tuple[tuple[str, str], ...] = ()
    arches: tuple[str, ...] = ARCHES
    # Leave out the CUDA builds (hundreds of megabytes) for a site with no NVIDIA node.
    cpu_only: bool = False
    tar: bool = False
    # Wheels copied as they are (llmgw's own among them) instead of asking pip for them.
    wheelhouse: Path | None = None
    # Where pip downloads an engine's locked wheels (vLLM's) from, instead of pip's own configuration
    # and the lock's extra indexes: a site's PyPI mirror, as agent.yaml's engines.<kind>.index_url.
    index_url: str = ""
    # What pip builds llmgw's wheel from: a version pin, a source directory, a wheel.
    llmgw_spec: str = f"llmgw=={__version__}"
    hf_endpoint: str = "https://huggingface.co"
    hf_token: str | None = None
    release_api: str = "https://api.github.com"
    release_download: str = "https://github.com"


@attrs.frozen
class Created:
    path: Path
    manifest: Manifest
    sha256: str


def default_llmgw_spec(origin: Origin) -> str:
    """What pip builds llmgw's wheel from when --llmgw is not given: the llmgw running this.

    A version built from a checkout is on no index, and `llmgw==VERSION` failed at once there
    ("Could not find a version that satisfies the requirement llmgw==0.1.0"): the checkout itself,
    or the wheel file it was installed from, is what pip is given instead.
    """
    if origin.checkout is not None:
        return str(origin.checkout)
    if origin.wheel is not None and origin.wheel.is_file():
        return str(origin.wheel)
    return f"llmgw=={__version__}"


def parse_engines(specs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """ "llamacpp=b11434" -> ("llamacpp", "b11434"); BundleError naming what is wrong."""
    out = []
    for spec in specs:
        engine, eq, version = spec.partition("=")
        if not eq or not version:
            raise BundleError(f"--engines {spec!r}: write ENGINE=VERSION, such as llamacpp=b11434")
        if not _VERSION.fullmatch(version):
            # It becomes a directory of the bundle and of the mirror: "../x" would land elsewhere.
            raise BundleError(f"--engines {spec!r}: {version!r} is not a release tag (such as b11434)")
        if engine not in RECIPES:
            archived = sorted(name for name, r in RECIPES.items() if isinstance(r, Recipe))
            pipped = sorted(name for name in RECIPES if wheel_recipe(name) is not None)
            raise BundleError(
                f"--engines {spec!r}: llmgw installs {', '.join(archived)} from release archives and "
                f"{', '.join(pipped)} from the wheels of a lock; {engine} is installed by hand and has "
                "nothing to bundle"
            )
        if wheel_recipe(engine) is not None:
            check_locked(engine, version)
        out.append((engine, version))
    return tuple(out)


def parse_arches(text: str) -> tuple[str, ...]:
    arches = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in arches if a not in ARCHES]
    if unknown or not arches:
        raise BundleError(f"--arch {text!r}: name some of {', '.join(ARCHES)}, separated by commas")
    return arches


async def create_bundle(opts: CreateOptions, report: Report) -> Created:
    """Collect everything into opts.out (a directory, or a tar with opts.tar); BundleError when it cannot."""
    if await asyncio.to_thread(os.path.lexists, opts.out):
        raise BundleError(f"{opts.out} exists; a bundle is made into a new path")
    for ref in opts.models:
        parse_ref(ref)
    work = opts.out.with_name(opts.out.name + ".partial")
    await asyncio.to_thread(shutil.rmtree, work, True)
    await asyncio.to_thread(work.mkdir, parents=True)
    try:
        files: list[tuple[str, Kind, str]] = []
        files += await _wheels(work, opts, report)
        engines, engine_files = await _engines(work, opts, report)
        files += engine_files
        wheelhouses, wheel_files = await download_wheelhouses(
            work, opts.engines, opts.arches, opts.cpu_only, opts.index_url, report
        )
        files += wheel_files
        models, model_files = await _models(work, opts, report)
        files += model_files
        report(f"hashing {len(files)} files")
        listed = tuple(
            [await asyncio.to_thread(_listed, work, path, kind, what) for path, kind, what in sorted(files)]
        )
        manifest = Manifest(
            format=FORMAT,
            llmgw_version=__version__,
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            files=listed,
            engines=engines,
            models=models,
            wheelhouses=wheelhouses,
        )
        data = manifest.to_bytes()
        await asyncio.to_thread((work / MANIFEST).write_bytes, data)
        if opts.tar:
            await asyncio.to_thread(_write_tar, work, opts.out, manifest)
            await asyncio.to_thread(shutil.rmtree, work)
        else:
            await asyncio.to_thread(durable.move_into_place, work, opts.out)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, work, True)
        raise
    return Created(path=opts.out, manifest=manifest, sha256=digest(data))


async def _wheels(work: Path, opts: CreateOptions, report: Report) -> list[tuple[str, Kind, str]]:
    wheels = work / WHEELS
    await asyncio.to_thread(wheels.mkdir)
    if opts.wheelhouse is not None:
        report(f"copying the wheels in {opts.wheelhouse}")
        await asyncio.to_thread(_copy_wheels, opts.wheelhouse, wheels)
    else:
        report(f"building llmgw's wheel ({opts.llmgw_spec})")
        try:
            await run_pip(["wheel", "--no-deps", "--wheel-dir", str(wheels), opts.llmgw_spec])
        except BundleError as exc:
            if not opts.llmgw_spec.startswith("llmgw=="):
                raise
            raise BundleError(
                f"{exc}\n{opts.llmgw_spec} is on no package index pip reached: give llmgw's wheel or "
                f"source directory with --llmgw PATH (--llmgw dist/llmgw-{__version__}-py3-none-any.whl, "
                "or --llmgw . in a checkout)"
            ) from None
        own = await asyncio.to_thread(_own_wheel, wheels, "pip")
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        for arch in opts.arches:
            report(f"downloading llmgw's dependencies for {arch} (Python {python})")
            platforms = [arg for p in PIP_PLATFORMS[arch] for arg in ("--platform", p)]
            await run_pip(
                [
                    "download",
                    "--dest",
                    str(wheels),
                    "--only-binary=:all:",
                    "--python-version",
                    python,
                    *platforms,
                    str(own),
                ]
            )
    names = await asyncio.to_thread(lambda: sorted(p.name for p in wheels.glob("*.whl")))
    return [(f"{WHEELS}/{name}", "wheel", "") for name in names]


def _copy_wheels(source: Path, wheels: Path) -> None:
    if not source.is_dir():
        raise BundleError(f"--wheelhouse {source} is not a directory")
    found = sorted(source.glob("*.whl"))
    for path in found:
        shutil.copyfile(path, wheels / path.name)
    _own_wheel(wheels, f"--wheelhouse {source}")


def _own_wheel(wheels: Path, where: str) -> Path:
    own = sorted(wheels.glob("llmgw-*.whl"))
    if not own:
        raise BundleError(
            f"{where} gave no llmgw wheel (llmgw-VERSION-py3-none-any.whl); a site installs from it"
        )
    return own[-1]


async def _engines(
    work: Path, opts: CreateOptions, report: Report
) -> tuple[tuple[BundleEngine, ...], list[tuple[str, Kind, str]]]:
    engines: list[BundleEngine] = []
    files: list[tuple[str, Kind, str]] = []
    async with ReleaseClient(opts.release_api, opts.release_download) as releases:
        for engine, version in opts.engines:
            if wheel_recipe(engine) is not None:
                continue
            recipe = _archive_recipe(engine)
            assets: dict[str, str] = {}
            for arch in opts.arches:
                for build in _builds(engine, version, arch, opts.cpu_only):
                    assets.update({asset: arch for asset in build})
            report(f"asking {opts.release_api} for the digests of {recipe.repo} {version}")
            digests = await releases.digests(recipe.repo, version)
            directory = work / ENGINES / recipe.repo / "releases" / "download" / version
            await asyncio.to_thread(directory.mkdir, parents=True)
            # Every digest before any download: a release missing one is refused in seconds, not
            # after a gigabyte of the others.
            unchecked = [asset for asset in assets if asset not in digests]
            if unchecked:
                raise BundleError(
                    f"{recipe.repo} {version}: the publisher gives no sha256 for {', '.join(unchecked)}; "
                    "a bundle carries nothing that cannot be checked"
                )
            for asset, arch in assets.items():
                expected = digests[asset]
                report(f"downloading {asset}")
                got = await releases.download(
                    releases.asset_url(recipe.repo, version, asset), directory / asset
                )
                if got != expected:
                    raise BundleError(
                        f"{asset}: sha256 does not match the publisher's (expected {expected}, got {got})"
                    )
                files.append(
                    (
                        f"{ENGINES}/{recipe.repo}/releases/download/{version}/{asset}",
                        "engine",
                        f"{engine} {version} for {arch}",
                    )
                )
            engines.append(
                BundleEngine(
                    engine=engine,
                    repo=recipe.repo,
                    version=version,
                    arch=opts.arches,
                    digests={asset: digests[asset] for asset in assets},
                )
            )
    return tuple(engines), files


def _archive_recipe(engine: str) -> Recipe:
    recipe = RECIPES[engine]
    # parse_engines let only engines installed from release archives through.
    assert isinstance(recipe, Recipe), engine
    return recipe


def _builds(engine: str, version: str, arch: str, cpu_only: bool) -> list[tuple[str, ...]]:
    """The asset sets a node of arch could install: the recipe's choice without a GPU, and with one."""
    recipe = _archive_recipe(engine)
    hosts = [Host(arch=HOST_ARCH[arch])]
    if not cpu_only:
        hosts.append(Host(arch=HOST_ARCH[arch], nvidia_driver="any"))
    builds: list[tuple[str, ...]] = []
    for host in hosts:
        try:
            assets = recipe.choose(version, host).assets
        except UnsupportedError as exc:
            raise BundleError(f"{engine} {version} for {arch}: {exc}") from None
        if assets not in builds:
            builds.append(assets)
    return builds


async def _models(
    work: Path, opts: CreateOptions, report: Report
) -> tuple[tuple[BundleModel, ...], list[tuple[str, Kind, str]]]:
    models: list[BundleModel] = []
    files: list[tuple[str, Kind, str]] = []
    root = work / MODELS

    def progress(p: FetchProgress) -> None:
        report(p.describe())

    async with HubFetcher(root, opts.hf_endpoint, opts.hf_token) as fetcher:
        for ref in opts.models:
            repo, revision = parse_ref(ref)
            model = await fetcher.fetch(repo, revision, progress=progress)
            models.append(BundleModel(repo=model.repo, revision=model.revision, commit=model.commit))
            what = f"{model.repo}@{model.commit[:12]}"
            base = f"{MODELS}/{model.repo}/{model.commit}"
            files += [(f"{base}/{f.path}", "model", what) for f in model.files]
            files.append((f"{base}/{PINS}", "model", f"{what}: its pins"))
    await asyncio.to_thread(shutil.rmtree, root / INCOMING, True)
    return tuple(models), files


def _listed(work: Path, path: str, kind: Kind, what: str) -> BundleFile:
    hasher = hashlib.sha256()
    size = 0
    with (work / path).open("rb") as fh:
        while chunk := fh.read(_READ):
            hasher.update(chunk)
            size += len(chunk)
    return BundleFile(path=path, size=size, sha256=hasher.hexdigest(), kind=kind, what=what)


def _write_tar(work: Path, out: Path, manifest: Manifest) -> None:
    """An uncompressed tar, the manifest first: weights do not compress, and an uncompressed tar can be signed
    later by adding a member."""
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in (MANIFEST, *(f.path for f in manifest.files)):
            info = tar.gettarinfo(work / path, arcname=path)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o644
            with (work / path).open("rb") as fh:
                tar.addfile(info, fh)
    durable.move_into_place(tmp, out)
