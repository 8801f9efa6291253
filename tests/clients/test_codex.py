"""Codex CLI, from the npm registry, completes a turn through the gateway, set up as docs/gateway.md says.

`codex exec` (one task, then exit) with the Clients section's config.toml, a
provider whose base URL is the gateway's /v1 and whose wire API is the
Responses API: Codex CLI 0.171.0 sends one streamed `POST /v1/responses` of
about 40 KB, with no `max_output_tokens`. To the tiny model on llama-server,
whose grammar ends every reply, and to the sim engine; what the store charges
the key is what Codex reports it used (`turn.completed` of `--json`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests import needs

from . import docs
from .conftest import MODELS, TINY, Key, System, Usage, run

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.usefixtures("llama_server"),
]


@pytest.fixture(params=MODELS)
def model(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


async def test_codex_exec_completes_a_turn_and_the_store_charges_what_it_reports(
    system: System, key: Key, model: str, tmp_path: Path
) -> None:
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(docs.codex_config(f"{system.url}", model))
    env, command = docs.codex_command(key.plaintext)
    assert command[:2] == ["codex", "exec"]
    # A home of its own: Codex keeps its sessions and logs there, never in the user's.
    env |= {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(codex_home)}
    argv = [needs.client("codex"), "exec", "--skip-git-repo-check", "--json", "say hi"]
    ran = await run(argv, env, tmp_path)
    assert ran.returncode == 0, f"codex exited with {ran.returncode}:\n{ran.stdout}\n{ran.stderr}"
    events: list[dict[str, Any]] = [
        json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")
    ]
    kinds = [event["type"] for event in events]
    assert kinds[0] == "thread.started" and kinds[-1] == "turn.completed", kinds
    said = [
        e["item"]["text"]
        for e in events
        if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"
    ]
    assert said == (["Hi there."] if model == TINY else ["say hi"])
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 1000 and usage["output_tokens"] > 0
    await system.charged(key, Usage(1, usage["input_tokens"], usage["output_tokens"]))
