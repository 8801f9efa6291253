"""The seam every command of the installer goes through.

Package managers, `ldd` and the engine's own `--version` are all run through a
`CommandRunner`, so tests answer for a machine they are not running on, and
production runs them through llmgw's launcher (launcher.py), never blocking the loop.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping, Sequence
from typing import Protocol

from llmgw import launcher
from llmgw.launcher import CommandResult

__all__ = ["CommandResult", "CommandRunner", "SubprocessRunner"]


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
    """Runs commands through llmgw's launcher, each in its own process group."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        # Its own group, so a timeout or a cancelled pass takes down whatever the
        # command started too (apt-get's dpkg, a wrapper's child).
        try:
            return await launcher.run(argv, env=env, timeout_s=timeout_s)
        except FileNotFoundError:
            return CommandResult(127, f"{argv[0]}: command not found")
        except PermissionError:
            return CommandResult(126, f"{argv[0]}: permission denied")

    async def which(self, program: str) -> str | None:
        return await asyncio.to_thread(shutil.which, program)
