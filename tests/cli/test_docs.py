"""Every command and flag a person can type is in docs/cli.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from llmgw.cli.main import main

CLI_DOC = Path(__file__).parent.parent.parent / "docs" / "cli.md"


def _walk(command: click.Command, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            yield from _walk(sub, (*path, name))


_EVERYTHING = list(_walk(main, ("llmgw",)))


@pytest.mark.parametrize(("path", "command"), _EVERYTHING, ids=[" ".join(p) for p, _ in _EVERYTHING])
def test_every_command_and_flag_is_documented(path: tuple[str, ...], command: click.Command) -> None:
    text = CLI_DOC.read_text(encoding="utf-8")
    if len(path) > 1:
        # A top-level command as `llmgw NAME`; below it, the words after the group's name.
        words = f"llmgw {path[1]}" if len(path) == 2 else " ".join(path[2:])
        assert words in text, f"docs/cli.md never mentions `{' '.join(path)}`"
    flags = [
        opt
        for param in command.params
        if isinstance(param, click.Option)
        for opt in param.opts
        if opt.startswith("--") and opt not in ("--help",)
    ]
    missing = [flag for flag in flags if flag not in text]
    assert missing == [], f"docs/cli.md lacks {missing} of `{' '.join(path)}`"
