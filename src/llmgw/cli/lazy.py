"""A click group that imports a command's module only when that command runs.

Importing every command at start made `llmgw --version` take well over a
second: ctl alone pulls in aiohttp, the admin API and placement, and an
operator typing `llmgw --help` pays for all of it. This is click's documented
lazy-loading pattern; the one addition is that each command's summary is kept
beside its import path, so that listing the commands imports none of them
(tests/cli/test_main.py holds each summary equal to the command's own help).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import attrs
import click


@attrs.frozen
class LazyCommand:
    """Where a command lives ("llmgw.cli.ctl:ctl") and the first line of its help."""

    target: str
    summary: str

    def load(self) -> click.Command:
        module, _, name = self.target.partition(":")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.target} is not a click command")
        return command


class LazyGroup(click.Group):
    """A group whose lazy_commands are imported on first use."""

    def __init__(self, *args: Any, lazy_commands: Mapping[str, LazyCommand] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = self.lazy_commands.get(cmd_name)
        if lazy is None:
            return super().get_command(ctx, cmd_name)
        return lazy.load()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The Commands section of --help, from the summaries: nothing is imported to list them."""
        commands: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            lazy = self.lazy_commands.get(name)
            command = click.Command(name, help=lazy.summary) if lazy else super().get_command(ctx, name)
            if command is not None and not command.hidden:
                commands.append((name, command))
        if not commands:
            return
        # The same layout as click's own: three times the default spacing.
        limit = formatter.width - 6 - max(len(name) for name, _ in commands)
        with formatter.section("Commands"):
            formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in commands])
