"""Does a binary accept the command line llmgw would give it?

An engine built by hand, or a release older or newer than the one llmgw was
tested against, may have renamed or dropped a flag the adapter passes. The
engine then exits at once with a usage message, and the replica fails on
every node it is placed on. `llmgw ctl engine-check` says so before a
replica is placed: it runs the binary's `--help` and `--version`, builds the
adapter's command lines for a replica that exercises every branch (GPUs, a
context size, slots, and a rank of a replica over two nodes), and lists
each flag of those command lines that `--help` does not mention.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Sequence

import attrs

from llmgw.engines.base import Engine, LaunchSpec
from llmgw.errors import LlmgwError
from llmgw.launcher import run as run_command

# `vllm --help` imports torch, which takes tens of seconds on a cold cache.
TIMEOUT_S = 180.0
# More than any engine's --help prints (vLLM's --help=all: some 100 KB).
_HELP_BYTES = 16 * 1024 * 1024

# Between them every flag an adapter may pass: a replica on a GPU with a context size and
# slots, and the second rank of a replica over two nodes (vLLM's --headless, the rank flags).
_SPECS = (
    LaunchSpec(
        model="engine-check",
        port=8000,
        model_path="/weights/engine-check",
        gpu_indices=(0,),
        context_size=4096,
        parallel=4,
    ),
    LaunchSpec(
        model="engine-check",
        port=8000,
        model_path="/weights/engine-check",
        gpu_indices=(0,),
        context_size=4096,
        parallel=4,
        rank=1,
        world_size=2,
        master_addr="10.0.0.1",
        master_port=29500,
    ),
)


class EngineCheckError(LlmgwError):
    """The binary could not be checked at all (not runnable, no help); the message says why."""


class BinaryNotFoundError(EngineCheckError):
    """There is no such binary: not at the path given, or not on the PATH."""


@attrs.frozen
class EngineCheck:
    """What one binary says about itself, and the flags llmgw passes that it does not mention."""

    engine: str
    # The executable checked, as a path.
    binary: str
    # The first line of its version output; empty when it printed none.
    version: str
    # Why the version could not be read; empty when it was.
    version_error: str
    # Every flag llmgw passes this engine, in the order of its command line.
    flags: tuple[str, ...]
    # The flags its --help does not mention: each one would stop the engine at start.
    missing: tuple[str, ...]
    # The command that printed the help, as a person would type it.
    help_command: str

    @property
    def ok(self) -> bool:
        return not self.missing and not self.version_error


def flags_of(argv: Sequence[str], words: int) -> list[str]:
    """The flags of argv (its binary and launcher words left out), each once, in order."""
    seen: list[str] = []
    for token in argv[1 + words :]:
        if not token.startswith("-") or _is_number(token):
            continue
        flag = token.split("=", 1)[0]
        if flag not in seen:
            seen.append(flag)
    return seen


def mentioned(flag: str, help_text: str) -> bool:
    """Whether help_text names flag as a whole word (`-c` is not in `-cl` nor in `--ctx`)."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


async def check_engine(
    name: str, engine: Engine, binary: str = "", *, timeout_s: float = TIMEOUT_S
) -> EngineCheck:
    """Run binary's --help and --version (the adapter's default binary when none is named) and compare."""
    argvs = _command_lines(engine, binary)
    helping = engine.help_for(argvs[0][0])
    path = await _resolve(argvs[0][0], name, named=bool(binary))
    flags: list[str] = []
    for argv in argvs:
        flags += [flag for flag in flags_of(argv, helping.words) if flag not in flags]
    help_argv = [path, *argvs[0][1 : 1 + helping.words], *helping.help]
    # Help, then version, one at a time: for vLLM each imports torch, and two at once are both slower.
    help_code, help_text = await _run(help_argv, timeout_s)
    shown = " ".join([os.path.basename(path), *help_argv[1:]])
    # A help that names none of them is not this engine's help: the wrong binary, or an
    # error (SGLang not installed in that interpreter), and "every flag is missing" would mislead.
    if not any(mentioned(flag, help_text) for flag in flags):
        _refuse_a_missing_module(name, path, argvs[0][1 : 1 + helping.words], help_text)
        said = _first_line(help_text)
        raise EngineCheckError(
            f"`{shown}` (exit {help_code}) names none of the flags llmgw passes {name}, "
            f"so {path} is not {name} or cannot run; it said: " + (said or "nothing")
        )
    probe = engine.probe_command(path)
    version_code, version_text = await _run(probe, timeout_s)
    version = _version_line(version_text)
    version_error = ""
    if version_code != 0 or not version:
        said = f": {version}" if version else ", printing nothing"
        version_error = (
            f"`{' '.join([os.path.basename(path), *probe[1:]])}` failed (exit {version_code}){said}"
        )
        version = ""
    return EngineCheck(
        engine=name,
        binary=path,
        version=version,
        version_error=version_error,
        flags=tuple(flags),
        missing=tuple(flag for flag in flags if not mentioned(flag, help_text)),
        help_command=shown,
    )


def _refuse_a_missing_module(name: str, path: str, launcher: Sequence[str], said: str) -> None:
    """BinaryNotFoundError when an engine run as `python -m MODULE` is not installed in that interpreter.

    SGLang's default binary is python3, which every node has: its help then fails with
    ModuleNotFoundError, which read as a warning about flags on a node that merely has not
    installed SGLang yet, where the other engines say they are not installed.
    """
    if len(launcher) != 2 or launcher[0] != "-m":
        return
    package = launcher[1].split(".", 1)[0]
    if re.search(rf"No module named '{re.escape(package)}[.']", said):
        raise BinaryNotFoundError(f"{name} is not installed in {path} (No module named '{package}')")


def _command_lines(engine: Engine, binary: str) -> list[list[str]]:
    """The adapter's argv for each spec it can run with binary.

    A shape the adapter refuses with this binary (vLLM's interpreter cannot run a rank that serves
    no HTTP) is one the supervisor would refuse in words too: not a flag for the help to name.
    """
    argvs = []
    for spec in _SPECS:
        try:
            argvs.append(engine.command(attrs.evolve(spec, binary=binary)))
        except LlmgwError:
            if spec is _SPECS[0]:
                raise
    return argvs


async def _resolve(binary: str, engine: str, *, named: bool) -> str:
    """binary as an executable path: as given when it has a slash, else looked up on the PATH."""
    found, exists = await asyncio.to_thread(_which, binary)
    if found:
        return found
    if os.sep in binary:
        if exists:
            raise EngineCheckError(f"{binary} is not executable")
        raise BinaryNotFoundError(f"{binary} does not exist")
    how = "" if named else f" (the {engine} adapter's default)"
    raise BinaryNotFoundError(f"there is no {binary}{how} on the PATH; name the binary with --bin PATH")


def _which(binary: str) -> tuple[str, bool]:
    """The absolute path of binary when it can be run, and whether a file of that name exists."""
    found = shutil.which(binary)
    if found is not None:
        return os.path.abspath(found), True
    return "", os.path.exists(binary)


async def _run(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    """argv's exit code and its stdout and stderr together (llama-server prints its version on stderr)."""
    try:
        # All of it: a help cut short would lose the flags it lists first, and they would read as missing.
        result = await run_command(argv, timeout_s=timeout_s, keep_bytes=_HELP_BYTES)
    except OSError as exc:
        raise EngineCheckError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    if result.timed_out:
        raise EngineCheckError(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s")
    return result.returncode, result.output


def _version_line(text: str) -> str:
    """The line that says the version: engines log their backends and platform before it."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # llama-server: "version: 0.6.0-dev (build 11434, …)" then "built with …"; vLLM and
    # SGLang: log lines, then the bare version last.
    return next((line for line in lines if "version" in line.lower()), lines[-1] if lines else "")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
