"""An engine installed with pip, carried in a bundle: every wheel of the lock a node would install.

vLLM is no release archive but the wheels of a lock llmgw ships
(engines/locks/vllm-VERSION-VARIANT.txt), which a node installs with
`pip install --require-hashes --no-deps`. A bundle carries exactly those wheels,
downloaded here the same way (`pip download --require-hashes --no-deps
--only-binary :all:`, for the Python and machine the lock's header names), so
a wheel that is not the one the lock pins is refused before it is carried. The
import places them in the mirror, which serves the directory as a page of
links a node's pip reads with `--no-index --find-links URL`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from llmgw import launcher
from llmgw.agent.discovery.host import Host
from llmgw.agent.provision.recipes import RECIPES
from llmgw.bundle.manifest import BundleError, BundleWheelhouse, Kind, wheelhouse_path
from llmgw.engines.base import UnsupportedError, WheelRecipe, Wheels
from llmgw.engines.wheel_locks import read_header

# A node's architecture as the recipes name it (Host.arch), and pip's platform tags for it.
HOST_ARCH = {"x64": "amd64", "arm64": "arm64"}
PIP_PLATFORMS = {
    "x64": ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "linux_x86_64"),
    "arm64": ("manylinux_2_28_aarch64", "manylinux2014_aarch64", "linux_aarch64"),
}
_ARCH_OF_MACHINE = {machine: arch for arch, machine in HOST_ARCH.items()}
Report = Callable[[str], None]


def wheel_recipe(engine: str) -> WheelRecipe | None:
    recipe = RECIPES.get(engine)
    return recipe if isinstance(recipe, WheelRecipe) else None


def check_locked(engine: str, version: str) -> None:
    """BundleError unless llmgw ships a lock of engine at version: refused before anything is downloaded."""
    recipe = wheel_recipe(engine)
    assert recipe is not None, engine
    why = ""
    for host in _hosts(HOST_ARCH.values(), cpu_only=False):
        try:
            recipe.choose(version, host)
            return
        except UnsupportedError as exc:
            why = why or str(exc)
    raise BundleError(f"--engines {engine}={version}: {why}")


async def run_pip(args: list[str]) -> None:
    result = await launcher.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args])
    if result.returncode != 0:
        tail = "\n".join(result.output.strip().splitlines()[-5:])
        raise BundleError(f"`pip {' '.join(args[:1])}` failed (exit {result.returncode}):\n{tail}")


async def download_wheelhouses(
    work: Path,
    engines: Sequence[tuple[str, str]],
    arches: Sequence[str],
    cpu_only: bool,
    index_url: str,
    report: Report,
) -> tuple[tuple[BundleWheelhouse, ...], list[tuple[str, Kind, str]]]:
    """The wheels of each lock a node of arches could install, in work; the manifest's entries for them."""
    houses: list[BundleWheelhouse] = []
    files: list[tuple[str, Kind, str]] = []
    for engine, version in engines:
        recipe = wheel_recipe(engine)
        if recipe is None:
            continue
        for wheels in await _locks(recipe, engine, version, arches, cpu_only, report):
            header = await asyncio.to_thread(read_header, wheels.lock)
            house = BundleWheelhouse(
                engine=engine,
                version=version,
                variant=wheels.variant,
                machine=header.machine,
                path=wheelhouse_path(engine, version, wheels.variant),
            )
            directory = work / house.path
            await asyncio.to_thread(directory.mkdir, parents=True)
            arch = _ARCH_OF_MACHINE.get(header.machine, arches[0])
            pythons = header.pythons or (f"{sys.version_info.major}.{sys.version_info.minor}",)
            for python in pythons:
                report(
                    f"downloading the wheels of {recipe.title} {version} ({wheels.variant}) for {arch} "
                    f"and Python {python}, as its lock pins them"
                    + (f" ({header.needs_mb / 1000:.1f} GB installed)" if header.needs_mb else "")
                )
                await run_pip(download_argv(wheels, directory, arch, python, index_url))
            names = await asyncio.to_thread(_wheel_names, directory)
            if not names:
                raise BundleError(f"pip downloaded no wheel of {house.label}'s lock {wheels.lock}")
            what = f"{recipe.title} {version} ({wheels.variant})"
            files += [(f"{house.path}/{name}", "engine", what) for name in names]
            houses.append(house)
    return tuple(houses), files


async def _locks(
    recipe: WheelRecipe, engine: str, version: str, arches: Sequence[str], cpu_only: bool, report: Report
) -> list[Wheels]:
    """The locks a node of arches could install, each once; BundleError when there is none."""
    chosen: list[Wheels] = []
    for arch in arches:
        for host in _hosts([HOST_ARCH[arch]], cpu_only):
            kind = f"{arch} nodes {'with' if host.nvidia_driver else 'without'} an NVIDIA driver"
            try:
                wheels = recipe.choose(version, host)
            except UnsupportedError as exc:
                report(f"{recipe.title} {version}: nothing to carry for {kind}: {exc}")
                continue
            header = await asyncio.to_thread(read_header, wheels.lock)
            if header.machine and header.machine != host.arch:
                report(
                    f"{recipe.title} {version}: nothing to carry for {kind}: its lock is for {header.machine}"
                )
                continue
            if all(w.lock != wheels.lock for w in chosen):
                chosen.append(wheels)
    if not chosen:
        raise BundleError(
            f"llmgw has no lock of {recipe.title} {version} for {', '.join(arches)} nodes, so there are no "
            f"wheels of {engine} to carry"
        )
    return chosen


def _wheel_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.whl"))


def _hosts(machines: Iterable[str], cpu_only: bool) -> list[Host]:
    hosts = []
    for machine in machines:
        hosts.append(Host(arch=machine))
        if not cpu_only:
            hosts.append(Host(arch=machine, nvidia_driver="any"))
    return hosts


def download_argv(wheels: Wheels, directory: Path, arch: str, python: str, index_url: str) -> list[str]:
    """pip downloading exactly the lock, as a node installs it: every hash checked, nothing resolved."""
    argv = ["download", "--require-hashes", "--no-deps", "--only-binary", ":all:", "--progress-bar", "off"]
    argv += ["--python-version", python, *(arg for p in PIP_PLATFORMS[arch] for arg in ("--platform", p))]
    argv += ["--dest", str(directory), "-r", str(wheels.lock)]
    if index_url:
        # A site's own index replaces PyPI and the lock's extra indexes, as agent.yaml's index_url does.
        return [*argv, "--index-url", index_url]
    # Else pip's own configuration (PIP_INDEX_URL, pip.conf; PyPI by default) and the indexes the lock
    # needs besides (PyTorch's, for torch's CPU build).
    for extra in wheels.extra_indexes:
        argv += ["--extra-index-url", extra]
    return argv
