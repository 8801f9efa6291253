"""Claude Code, from the npm registry, completes a turn through the gateway, set up as docs/gateway.md says.

`claude -p` (print mode: one turn, then exit) with the environment of the
Clients section's example: Claude Code 2.1.197 sends `HEAD /`, then one
streamed `POST /v1/messages?beta=true` of about 76 KB (its system prompt, 24
tools, a system turn after the user's) with `anthropic-version` and
`anthropic-beta`. To the tiny model on llama-server, whose grammar ends every
reply, and to the sim engine; what the store charges the key is what Claude
Code reports it used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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


async def _claude(
    system: System, key: Key, model: str, home: Path, *, bearer: bool = False
) -> dict[str, object]:
    """`claude -p "say hi" --output-format json` as the docs set it up; its result."""
    env, argv = docs.claude_code(system.url, key.plaintext, model)
    if bearer:
        env["ANTHROPIC_AUTH_TOKEN"] = env.pop("ANTHROPIC_API_KEY")
    # A home of its own: Claude Code keeps its settings and sessions there, never in the user's.
    env |= {"PATH": os.environ["PATH"], "HOME": str(home)}
    ran = await run([needs.client("claude"), "-p", "say hi", *argv, "--output-format", "json"], env, home)
    assert ran.returncode == 0, f"claude exited with {ran.returncode}:\n{ran.stdout}\n{ran.stderr}"
    result: dict[str, object] = json.loads(ran.stdout)
    return result


def _charged(result: dict[str, object]) -> Usage:
    """What Claude Code says the turn used: its input (cached or not) and output tokens."""
    usage = result["usage"]
    assert isinstance(usage, dict)
    cached = usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]
    return Usage(1, usage["input_tokens"] + cached, usage["output_tokens"])


async def test_claude_p_completes_a_turn_and_the_store_charges_what_it_reports(
    system: System, key: Key, model: str, tmp_path: Path
) -> None:
    result = await _claude(system, key, model, tmp_path)
    assert (result["is_error"], result["stop_reason"], result["num_turns"]) == (False, "end_turn", 1)
    if model == TINY:
        assert result["result"] == "Hi there."
    usage = _charged(result)
    # Its system prompt and tools alone are thousands of tokens, whichever engine counts them.
    assert usage.prompt_tokens > 1000 and usage.completion_tokens > 0
    await system.charged(key, usage)


async def test_claude_code_with_a_bearer_token_completes_a_turn_too(
    system: System, key: Key, tmp_path: Path
) -> None:
    """ANTHROPIC_AUTH_TOKEN in place of ANTHROPIC_API_KEY: the key as `Authorization: Bearer`."""
    result = await _claude(system, key, TINY, tmp_path, bearer=True)
    assert (result["is_error"], result["result"]) == (False, "Hi there.")
    await system.charged(key, _charged(result))


async def test_without_the_output_limit_claude_code_is_told_the_models_limit(
    system: System, key: Key, tmp_path: Path
) -> None:
    """It asks for 32,000 tokens, past the model's 4,096: the refusal it prints says so, and costs nothing."""
    env, argv = docs.claude_code(system.url, key.plaintext, TINY)
    del env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]
    env |= {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    ran = await run([needs.client("claude"), "-p", "say hi", *argv], env, tmp_path)
    assert ran.returncode == 1
    assert ran.stdout.startswith(
        f"API Error: 400 this request asks for up to 32000 completion tokens; {TINY} allows at most 4096"
    ), ran.stdout + ran.stderr
    assert "(Claude Code: set CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096)" in ran.stdout, ran.stdout
    assert (await system.usage(key)).prompt_tokens == 0
