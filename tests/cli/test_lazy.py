"""`llmgw` imports a command's module only when that command runs (cli/lazy.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from llmgw.cli.main import COMMANDS, main

COMMAND_MODULES = sorted(command.target.partition(":")[0] for command in COMMANDS.values())

# Runs `llmgw ARGS` in a fresh interpreter and prints which command modules and heavy libraries it imported.
_PROBE = """
import json, sys
from llmgw.cli.main import main
try:
    main(sys.argv[1:], prog_name="llmgw")
except SystemExit:
    pass
watched = [*{modules!r}, "aiohttp", "grpclib", "cryptography"]
print(json.dumps(sorted(m for m in watched if m in sys.modules)), file=sys.stderr)
"""


def imported_by(*args: str) -> list[str]:
    probe = _PROBE.format(modules=COMMAND_MODULES)
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True, timeout=60
    )
    imported: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return imported


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_import_no_command_and_no_network_library(flag: str) -> None:
    assert imported_by(flag) == []


def test_a_command_imports_its_own_module_and_not_the_others() -> None:
    assert imported_by("keys", "--help") == ["llmgw.cli.keys"]


def test_each_summary_in_the_listing_is_the_first_line_of_the_commands_own_help() -> None:
    for name, lazy in COMMANDS.items():
        command = lazy.load()
        assert command.name == name
        assert lazy.summary == (command.help or "").strip().splitlines()[0], name


def test_help_lists_every_command_with_its_summary() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    commands = result.output.split("Commands:\n", 1)[1]
    assert [line.split()[0] for line in commands.splitlines() if line.strip()] == sorted(COMMANDS)
    # Padded to the longest command's name, whichever that is.
    assert re.search(r"^  keys +API keys for the gateway's /v1 routes\.$", commands, re.MULTILINE)


def test_an_unknown_command_is_still_a_usage_error_naming_it() -> None:
    result = CliRunner().invoke(main, ["nope"])
    assert result.exit_code == 2 and "No such command 'nope'" in result.output
