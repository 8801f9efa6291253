"""The seam every command of the installer goes through.

Package managers, `ldd` and the engine's own `--version` are all run through a
`CommandRunner`, so tests answer for a machine they are not running on, and
production runs them as asyncio subprocesses that never block the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

# How much of a command's output is kept: enough for the last lines of an
# apt-get failure, not an unbounded buffer of a chatty engine.
_MAX_OUTPUT = 256 * 1024


@attrs.frozen
class CommandResult:
    """How a command ended: its exit status and its output, stdout and stderr together."""

    returncode: int
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def last_line(self) -> str:
        lines = [line.strip() for line in self.output.strip().splitlines() if line.strip()]
        return lines[-1] if lines else ""


class CommandRunner(Protocol):
    """Runs commands for the installer."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        """Run argv to completion; env is added to the agent's own environment.

        A program that does not exist ends with status 127, as in a shell, rather
        than raising: to the installer it is one more way a command failed.
        """
        ...

    async def which(self, program: str) -> str | None:
        """The path of program on PATH, or None when this machine has none."""
        ...


class SubprocessRunner:
    """Runs commands as asyncio subprocesses, each in its own process group."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        full_env = {**os.environ, **env} if env else None
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=full_env,
                # Its own group, so a timeout or a cancelled pass takes down
                # whatever the command started too (apt-get's dpkg, a wrapper's child).
                start_new_session=True,
            )
        except FileNotFoundError:
            return CommandResult(127, f"{argv[0]}: command not found")
        except PermissionError:
            return CommandResult(126, f"{argv[0]}: permission denied")
        output = bytearray()
        try:
            async with asyncio.timeout(timeout_s):
                await _pump(proc, output)
                await proc.wait()
        except TimeoutError:
            _kill_group(proc)
            # What it printed before it was killed is often the reason it hung.
            # Bounded, because a grandchild that left the group can hold the pipe open.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await _pump(proc, output)
            await proc.wait()
            return CommandResult(-1, _decode(output), timed_out=True)
        except BaseException:
            _kill_group(proc)
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())
            raise
        return CommandResult(proc.returncode if proc.returncode is not None else -1, _decode(output))

    async def which(self, program: str) -> str | None:
        return await asyncio.to_thread(shutil.which, program)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _pump(proc: asyncio.subprocess.Process, into: bytearray) -> None:
    assert proc.stdout is not None
    while chunk := await proc.stdout.read(65536):
        into += chunk
        # Only the tail matters; an engine that prints without end must not fill memory.
        if len(into) > 2 * _MAX_OUTPUT:
            del into[:-_MAX_OUTPUT]


def _decode(out: bytearray) -> str:
    return bytes(out[-_MAX_OUTPUT:]).decode("utf-8", errors="replace")
