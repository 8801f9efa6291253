"""docs/architecture.md names only configuration keys and commands that exist."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from llmgw import config
from llmgw.cli.main import main
from llmgw.config import AgentConfig, MirrorConfig, ServerConfig
from llmgw.proto.llmgw import v1 as pb

REPO = Path(__file__).parent.parent
ARCHITECTURE = REPO / "docs" / "architecture.md"

# `control.interval_s`, `engines:`, `drain_timeout_s`: what reads as a configuration key.
_KEY = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*(?:\.[a-z][a-z0-9]*(?:_[a-z0-9]+)*)*:?$")
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def _quoted(text: str) -> list[str]:
    """Every `inline code` of text, those in fenced blocks included (the layout quotes commands)."""
    return re.findall(r"`([^`\n]+)`", text.replace("```", ""))


def _config_keys() -> tuple[set[str], set[str]]:
    """(every dotted key, every key's own name) of server.yaml, agent.yaml and mirror.yaml."""
    dotted = {
        key.replace("[]", "").replace(".<name>", "")
        for cls in (ServerConfig, AgentConfig, MirrorConfig)
        for key, _ in config.documented_keys(cls)
    }
    return dotted, {key.rpartition(".")[2] for key in dotted}


def _protocol_fields() -> set[str]:
    """Field names of the protocol's messages (`engines_changed`), which read like keys too."""
    messages = [
        value for value in vars(pb).values() if isinstance(value, type) and dataclasses.is_dataclass(value)
    ]
    return {field.name for message in messages for field in dataclasses.fields(message)}


def _options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in getattr(param, "opts", ())}


def _walk(command: click.Command) -> Iterator[click.Command]:
    yield command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            yield from _walk(sub)


def _command_problem(words: list[str]) -> str | None:
    """Why `llmgw WORDS…` is not a command line llmgw has, or None when it is."""
    command: click.Command = main
    ctx = click.Context(main, info_name="llmgw")
    takes_value = False
    for word in words:
        if takes_value:
            takes_value = False
            continue
        if word.startswith("--"):
            flag = word.partition("=")[0]
            params = {opt: param for param in command.params for opt in getattr(param, "opts", ())}
            if flag not in params:
                return f"`{ctx.command_path}` has no {flag}"
            param = params[flag]
            takes_value = "=" not in word and not (isinstance(param, click.Option) and param.is_flag)
        elif isinstance(command, click.Group) and _NAME.match(word):
            sub = command.get_command(ctx, word)
            if sub is None:
                return f"`{ctx.command_path}` has no command {word}"
            command, ctx = sub, click.Context(sub, parent=ctx, info_name=word)
    return None


_TOKENS = _quoted(ARCHITECTURE.read_text(encoding="utf-8"))


def test_the_page_quotes_keys_and_commands_for_the_test_to_check() -> None:
    """A page rewritten without backticks would pass the checks below while checking nothing."""
    assert any(token.startswith("llmgw ") for token in _TOKENS)
    assert any("." in token and _KEY.match(token) for token in _TOKENS)


def test_every_configuration_key_it_names_exists() -> None:
    dotted, names = _config_keys()
    allowed_bare = names | _protocol_fields()
    missing = []
    for token in _TOKENS:
        if not _KEY.match(token) or ("." not in token and "_" not in token and not token.endswith(":")):
            continue
        key = token.rstrip(":")
        if key not in (dotted if "." in key else allowed_bare | dotted):
            missing.append(token)
    assert missing == [], f"docs/architecture.md names keys no configuration has: {missing}"


def test_every_command_it_names_exists() -> None:
    problems = []
    every_option = {opt for command in _walk(main) for opt in _options(command)}
    for token in _TOKENS:
        words = token.split()
        if words[0] == "ctl":
            words = ["llmgw", *words]
        if words[0] == "llmgw":
            problem = _command_problem(words[1:])
            if problem:
                problems.append(f"{token}: {problem}")
        elif token.startswith("--") and token.partition("=")[0] not in every_option:
            problems.append(f"{token}: no command has it")
    assert problems == [], "docs/architecture.md names commands llmgw does not have:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("ctl engine-check", None),
        ("llmgw --role=server --config /etc/llmgw/server.yaml", None),
        ("llmgw ctl model add -f model.yaml", None),
        ("llmgw ctl debug pprof", "`llmgw ctl` has no command debug"),
        ("llmgw --drain 5", "`llmgw` has no --drain"),
    ],
)
def test_the_command_check_tells_a_real_command_from_an_invented_one(line: str, problem: str | None) -> None:
    words = line.split()
    if words[0] == "ctl":
        words = ["llmgw", *words]
    assert _command_problem(words[1:]) == problem


def _layout_block() -> list[str]:
    """The lines of the fenced block under "## Layout": the tree as the page draws it."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## Layout", 1)[1]
    return section.split("```", 2)[1].splitlines()


def _layout_paths() -> list[str]:
    """Every path the layout block names, relative to the repository (`src/llmgw/control/stream/`)."""
    paths: list[str] = []
    parents: list[tuple[int, str]] = []
    for line in _layout_block():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        name = line.split()[0]
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = (parents[-1][1] if parents else "") + name
        paths.append(path)
        if name.endswith("/"):
            parents.append((indent, path))
    return paths


def test_every_path_the_layout_names_exists() -> None:
    """A module moved or renamed without the page following is a map that sends a reader astray."""
    paths = _layout_paths()
    assert any(path.startswith("src/llmgw/") for path in paths), "the layout block names no module"
    missing = [path for path in paths if not (REPO / path).exists()]
    assert missing == [], f"docs/architecture.md's layout names what the tree lacks: {missing}"


def test_the_layout_names_every_package() -> None:
    """A new package the page does not name is a room a reader cannot find from the map."""
    named = {path.rstrip("/") for path in _layout_paths()}
    src = REPO / "src" / "llmgw"
    packages = {
        str(init.parent.relative_to(REPO))
        for init in src.rglob("__init__.py")
        if "proto" not in init.relative_to(src).parts[:1] or init.parent == src / "proto"
    }
    packages.discard("src/llmgw")
    unnamed = sorted(packages - named)
    assert unnamed == [], f"docs/architecture.md's layout does not name these packages: {unnamed}"
