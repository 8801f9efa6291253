"""The Clients section of docs/gateway.md, read as the tests run it: what it tells a person is what they do.

Its examples name a placeholder gateway, key and model; the tests put the
system's own in their place and run the clients with exactly the rest.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

GATEWAY_MD = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"
URL = "http://gateway.example:8080"
KEY = "sk-llmgw-XXXXXXXX"
MODEL = "my-model"


def block(heading: str, language: str, index: int = 0) -> str:
    """The index-th fenced block in language under `### heading` of the Clients section."""
    text = GATEWAY_MD.read_text()
    clients = text[text.index("\n## Clients\n") :]
    start = clients.index(f"\n### {heading}\n")
    end = clients.find("\n### ", start + 1)
    section = clients[start : end if end > 0 else len(clients)]
    blocks = re.findall(rf"^```{language}\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) > index, f"docs/gateway.md, Clients, {heading}: no {language} block {index}"
    found: str = blocks[index]
    return found


def _ours(text: str, url: str, key: str, model: str) -> str:
    return text.replace(URL, url).replace(KEY, key).replace(MODEL, model)


def claude_code(url: str, key: str, model: str) -> tuple[dict[str, str], list[str]]:
    """The environment the Claude Code example exports, and the arguments its command line adds."""
    env: dict[str, str] = {}
    argv: list[str] = []
    for line in _ours(block("Claude Code", "sh"), url, key, model).splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            for word in words[1:]:
                name, value = word.split("=", 1)
                env[name] = value
        elif words[:1] == ["claude"]:
            argv = words[1:]
    return env, argv


def codex_config(url: str, model: str) -> str:
    """The config.toml of the Codex CLI example."""
    return _ours(block("Codex CLI", "toml"), url, KEY, model)


def codex_command(key: str) -> tuple[dict[str, str], list[str]]:
    """The environment the Codex CLI example sets on its command line, and the command's words."""
    words = shlex.split(_ours(block("Codex CLI", "sh"), URL, key, MODEL))
    env: dict[str, str] = {}
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def sdk_lines(url: str, key: str) -> str:
    """The Python that makes the two SDKs' clients."""
    return _ours(block("Anthropic's and OpenAI's SDKs", "python"), url, key, MODEL)
