"""Installing an engine that is a Python package: a virtual environment per version, from a lock.

vLLM (and, once it has a lock, SGLang) is not an archive but a few gigabytes
of wheels. Each version gets its own environment, `<root>/vllm/<version>-<variant>`,
made with one of the node's own Pythons, into which pip installs exactly the
lock llmgw ships (engines/wheel_locks.py): `--require-hashes --no-deps`, so
nothing is resolved on the node and a wheel that differs from the one tried
here is refused. As for archives, the environment is built in `<dir>.partial`
and renamed into place with its marker once `import <module>` has worked in it.

`install_env` and `recheck` take a directory, so a script or a test fixture
can make the same environment the agent would, where it likes.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import os
import re
import shutil
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import attrs

from llmgw.agent.provision.place import fresh_dirs, put_in_place, remove_dirs
from llmgw.agent.provision.runner import CommandResult, CommandRunner
from llmgw.engines.base import UnsupportedError, Wheels
from llmgw.engines.wheel_locks import LockHeader, read_header
from llmgw.errors import LlmgwError

DEFAULT_INDEX = "https://pypi.org/simple"

# The Pythons an engine's wheels are published for, newest first: the one a lock names is looked for
# among these names, and `python3` whatever its version.
PYTHONS = ("3.13", "3.12", "3.11", "3.10")

# pip fetching and unpacking gigabytes; an import that compiles nothing. Past these, stuck.
PIP_TIMEOUT_S = 3600.0
VENV_TIMEOUT_S = 300.0
IMPORT_TIMEOUT_S = 600.0

# What the recheck prints before the version, so a warning the import logs on the way is not read as it.
_VERSION_TAG = "llmgw-version:"

_HASH_ENTRY = re.compile(r"^\s+\S+ from (\S+?)(?: \(from .*\))?:\s*$")
_EXPECTED = re.compile(r"Expected sha256 (\w+)")
_GOT = re.compile(r"Got\s+(\w+)")
_UNREACHABLE = ("could not fetch url", "newconnectionerror", "connecttimeout", "max retries exceeded")
_UNREACHABLE_WHY = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)|(SSLError|timed out|Connection refused)")
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")


class WheelError(LlmgwError):
    """An environment that cannot be made; the message is the status's detail."""


@attrs.frozen
class WheelSource:
    """Where pip takes the wheels from when not from the package registry and the lock's extra indexes."""

    # A site's own index (a PyPI mirror): replaces the registry and every extra index.
    index_url: str = ""
    # A directory of wheels (or a URL listing them): pip asks no index at all.
    wheelhouse: str = ""


@attrs.frozen
class EnvInstall:
    """One environment to make: what, where, and how to name it in a sentence."""

    wheels: Wheels
    directory: Path
    # "vLLM 0.32.0 (cpu)".
    label: str
    # What the marker records.
    engine: str
    version: str
    # The node's architecture in Host's spelling; empty when unknown, and then not checked.
    arch: str = ""


async def install_env(
    runner: CommandRunner,
    job: EnvInstall,
    source: WheelSource,
    progress: Callable[[str], None],
) -> str:
    """Make job's environment from its lock and check it imports; the version it reports.

    Raises WheelError (or UnsupportedError when the lock is for another machine) in a person's words.
    """
    wheels, directory = job.wheels, job.directory
    header = await asyncio.to_thread(read_header, wheels.lock)
    check_machine(header, job.arch, job.label)
    await _check_space(directory, header, job.label)
    python, pyver = await find_python(runner, header, job.label)
    partial = directory.with_name(directory.name + ".partial")
    # pip unpacks every wheel in its temporary directory before installing any: gigabytes that
    # /tmp, often a small tmpfs, may not hold. Next to the install, the space check covers them.
    scratch = directory.with_name(directory.name + ".tmp")
    await asyncio.to_thread(fresh_dirs, partial, scratch)
    try:
        progress(f"making a Python {pyver} environment for {job.label}")
        res = await runner.run([python, "-m", "venv", str(partial)], timeout_s=VENV_TIMEOUT_S)
        if not res.ok:
            raise WheelError(f"{python} cannot make a virtual environment ({_venv_hint(pyver)}): {_how(res)}")
        progress(f"installing {wheels.distribution} and its packages with pip")
        res = await runner.run(
            pip_argv(partial, wheels, source),
            env={"TMPDIR": str(scratch), "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            timeout_s=PIP_TIMEOUT_S,
        )
        if not res.ok:
            raise WheelError(pip_failure(res, job, source, pyver))
        progress(f"checking that {wheels.module} imports")
        version = await recheck(runner, partial, wheels)
        marker = {
            "engine": job.engine,
            "version": job.version,
            "variant": wheels.variant,
            "binary": wheels.binary,
            "python": pyver,
            "lock": await asyncio.to_thread(lock_digest, wheels.lock),
            "installed": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        await asyncio.to_thread(put_in_place, partial, directory, marker)
    finally:
        await asyncio.to_thread(remove_dirs, partial, scratch)
    return version


async def recheck(runner: CommandRunner, directory: Path, wheels: Wheels) -> str:
    """Import the engine in its environment: "vllm 0.32.0", or WheelError saying why it does not."""
    python = directory / wheels.binary
    if not await asyncio.to_thread(python.is_file):
        raise WheelError(f"the environment has no {wheels.binary}")
    code = f"import {wheels.module}; print({_VERSION_TAG!r}, {wheels.module}.__version__)"
    res = await runner.run([str(python), "-c", code], timeout_s=IMPORT_TIMEOUT_S)
    said = [ln.split(_VERSION_TAG, 1)[1].strip() for ln in res.output.splitlines() if _VERSION_TAG in ln]
    if not res.ok or not said:
        raise WheelError(f"import {wheels.module} {_how(res)}")
    return f"{wheels.module} {said[-1]}"


async def find_python(runner: CommandRunner, header: LockHeader, label: str) -> tuple[str, str]:
    """A Python of the node that the lock's wheels are for: its path and version."""
    wanted = header.pythons or PYTHONS
    seen: list[str] = []
    for name in (*(f"python{v}" for v in wanted), "python3"):
        path = await runner.which(name)
        if path is None:
            continue
        res = await runner.run(
            [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout_s=60
        )
        version = res.last_line() if res.ok else ""
        if version in wanted:
            return path, version
        seen.append(f"{name} is {version or 'not runnable'}")
    has = f"it has only {', '.join(dict.fromkeys(seen))}" if seen else "it has none on its PATH"
    raise WheelError(
        f"{label} needs Python {' or '.join(wanted)}, the Python its lock holds wheels for, and {has}"
    )


def pip_argv(env: Path, wheels: Wheels, source: WheelSource) -> list[str]:
    """pip installing exactly the lock into env: nothing resolved, nothing built, every hash checked."""
    argv = [str(env / "bin" / "python"), "-m", "pip", "install", "--require-hashes", "--no-deps"]
    # No sdist: building one runs its setup code, and needs a compiler an engine node has no use for.
    argv += ["--only-binary", ":all:", "--no-input", "--progress-bar", "off", "-r", str(wheels.lock)]
    if source.wheelhouse:
        return [*argv, "--no-index", "--find-links", source.wheelhouse]
    if source.index_url:
        return [*argv, "--index-url", source.index_url]
    argv += ["--index-url", DEFAULT_INDEX]
    for extra in wheels.extra_indexes:
        argv += ["--extra-index-url", extra]
    return argv


def pip_failure(res: CommandResult, job: EnvInstall, source: WheelSource, pyver: str) -> str:
    """pip's failure as a sentence: the wheel whose hash differs, the index it could not reach."""
    out = res.output
    if "DO NOT MATCH THE HASHES" in out:
        return _hash_mismatch(out, job.label)
    if any(w in out.lower() for w in _UNREACHABLE):
        why = _UNREACHABLE_WHY.search(out)
        reason = f" ({(why.group(1) or why.group(2)).strip()})" if why else ""
        index = _where(out, job.wheels, source)
        return f"pip could not reach the package index {index}{reason}; nothing was installed"
    missing = _NO_MATCH.search(out)
    if missing:
        where = (
            f"the wheelhouse {source.wheelhouse}" if source.wheelhouse else _where(out, job.wheels, source)
        )
        wheel = missing.group(1)
        return f"{where} has no wheel of {wheel} for Python {pyver} on this machine; nothing was installed"
    if res.timed_out:
        return f"pip did not finish installing {job.label} in {int(PIP_TIMEOUT_S // 60)} minutes"
    return f"pip failed to install {job.label} (exit {res.returncode}): {res.last_line()}"


def lock_digest(lock: Path) -> str:
    """The sha256 of a lock, so a node notices when llmgw ships a different one for the same version."""
    return "sha256:" + hashlib.sha256(lock.read_bytes()).hexdigest()


def _hash_mismatch(out: str, label: str) -> str:
    lines = out.splitlines()
    for i, line in enumerate(lines):
        entry = _HASH_ENTRY.match(line)
        if entry is None:
            continue
        url = entry.group(1).split("#", 1)[0]
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        rest = "\n".join(lines[i + 1 : i + 4])
        expected, got = _EXPECTED.search(rest), _GOT.search(rest)
        sums = f" (got {got.group(1)[:12]}, expected {expected.group(1)[:12]})" if expected and got else ""
        return f"{name} does not match the hash in {label}'s lock{sums}; nothing was installed"
    return f"a wheel of {label} does not match the hash in its lock; nothing was installed"


def _where(out: str, wheels: Wheels, source: WheelSource) -> str:
    """The index pip was asked, or of several the one its failure names."""
    indexes = [source.index_url] if source.index_url else [DEFAULT_INDEX, *wheels.extra_indexes]
    for index in reversed(indexes):
        path = urllib.parse.urlsplit(index).path.rstrip("/")
        if index in out or (path and f"{path}/" in out):
            return index
    return " or ".join(indexes)


async def _check_space(directory: Path, header: LockHeader, label: str) -> None:
    if header.needs_mb <= 0:
        return
    mount, free = await asyncio.to_thread(_free_space, directory)
    if free < header.needs_mb * 1_000_000:
        raise WheelError(
            f"{label} needs {header.needs_mb / 1000:.1f} GB free on {mount} (the filesystem of "
            f"{directory.parent}), and it has {free / 1e9:.1f} GB; nothing was installed"
        )


def _free_space(directory: Path) -> tuple[str, int]:
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    mount = existing.resolve()
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return str(mount), shutil.disk_usage(existing).free


def check_machine(header: LockHeader, arch: str, label: str) -> None:
    """UnsupportedError when the lock's wheels are for another kind of machine."""
    if header.machine and arch and header.machine != arch:
        raise UnsupportedError(f"{label}'s lock holds wheels for {header.machine}, and this node is {arch}")


def _venv_hint(pyver: str) -> str:
    return f"on Debian and Ubuntu it needs the python{pyver}-venv package"


def _how(res: CommandResult) -> str:
    how = "did not finish in time" if res.timed_out else f"failed (exit {res.returncode})"
    last = res.last_line()
    return f"{how}: {last}" if last else how
