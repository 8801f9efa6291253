"""What admission reserves for a prompt is never below what a real llama-server counts of it.

llama-server serves the tiny model with a real SentencePiece vocabulary (byte
fallback: a character it lacks is a token per byte) and a chat template whose
role markers are plain text, several tokens each; each request asks for one
token, and its usage's prompt_tokens is the engine's own count. Needs the build
of scripts/build-llama-server.sh in its cache, as test_llama_server.py does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine
from llmgw.gateway.apis import CHAT, COMPLETIONS, MESSAGES, RESPONSES, Api, reply_usage
from llmgw.gateway.translation import Translation

from .test_llama_server import BUILD, _free_port, _wait_healthy, tiny_model

__all__ = ["tiny_model"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.usefixtures("llama_server"),
]

MODEL = "tiny-chat"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """llama-server serving the tiny model as tiny-chat in one slot of its whole context (2,048 tokens)."""
    engine = LlamaCppEngine()
    spec = LaunchSpec(
        model=MODEL,
        port=_free_port(),
        model_path=str(tiny_model),
        context_size=2048,
        parallel=1,
        binary=str(BUILD / "bin" / "llama-server"),
        args=("--threads", "2"),
    )
    log = tmp_path_factory.mktemp("llama-prompts") / "llama-server.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *engine.command(spec),
            env={**os.environ, **engine.environment(spec)},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://{spec.host}:{spec.port}"
    try:
        await _wait_healthy(base + engine.health_path, process, log)
        yield base
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


def _chat(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": r, "content": c} for r, c in turns], "max_tokens": 1}


# Each under the server's context of 2,048 tokens. Each tokenizes densely, or is all template.
_CHATS = {
    "one-letter words": _chat(("user", " ".join(["a"] * 400))),
    "CJK": _chat(("user", "汉字简体中文鑫龘" * 40)),
    "emoji, a token a byte": _chat(("user", "🙂👍🏽🦜" * 40)),
    "newlines and quotes": _chat(("user", "\n" * 200 + '"' * 200)),
    "control characters": _chat(("user", "\x01\x02\x1f" * 100)),
    "the template's own markers": _chat(("user", "<|user|>\n</s>" * 40)),
    "empty turns": _chat(*[("user" if i % 2 == 0 else "assistant", "") for i in range(41)]),
    "a system prompt": _chat(("system", "b " * 200), ("user", "c " * 200)),
}


async def _counted(server: str, path: str, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as session, session.post(server + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        usage = reply_usage((await resp.json())["usage"])
    assert usage is not None
    return usage[0]


def _reserved(api: Api, body: dict[str, Any]) -> int:
    return api.reserved_prompt(body, len(json.dumps(body).encode()))


@pytest.mark.parametrize("body", list(_CHATS.values()), ids=list(_CHATS))
async def test_a_chat_prompt_reserves_at_least_what_the_engine_counts(
    server: str, body: dict[str, Any]
) -> None:
    assert await _counted(server, "/v1/chat/completions", body) <= _reserved(CHAT, body)


async def test_400_one_letter_words_reserve_less_than_a_token_per_byte_and_no_less_than_counted(
    server: str,
) -> None:
    body = _CHATS["one-letter words"]
    counted = await _counted(server, "/v1/chat/completions", body)
    assert counted <= _reserved(CHAT, body) < len(json.dumps(body)) + 128


async def test_a_list_of_completion_prompts_reserves_at_least_what_the_engine_counts(server: str) -> None:
    body = {"model": MODEL, "prompt": ["🙂" * 60, "a " * 200], "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        counted = 0
        # llama-server answers a list of prompts with one completion each, and the usage of them all.
        async with session.post(server + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            counted = (await resp.json())["usage"]["prompt_tokens"]
    assert 0 < counted <= _reserved(COMPLETIONS, body)


async def test_a_messages_request_reserves_at_least_what_the_engine_counts(server: str) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 1,
        "system": [{"type": "text", "text": "汉字 " * 60}, {"type": "text", "text": "x\n" * 60}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a " * 100}]},
            {"role": "assistant", "content": "🙂" * 30},
            {"role": "user", "content": "b"},
        ],
    }
    assert await _counted(server, "/v1/messages", body) <= _reserved(MESSAGES, body)


@pytest.mark.parametrize(
    ("api", "body"),
    [
        (
            MESSAGES,
            {
                "model": MODEL,
                "max_tokens": 1,
                "system": [{"type": "text", "text": "汉字 " * 40}, {"type": "text", "text": "🙂" * 40}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a " * 200}]}],
            },
        ),
        (
            RESPONSES,
            {
                "model": MODEL,
                "max_output_tokens": 1,
                "instructions": "🦜" * 40,
                "input": [
                    {"role": "system", "content": "x\n" * 100},
                    {"role": "user", "content": [{"type": "input_text", "text": "a " * 200}]},
                ],
            },
        ),
    ],
    ids=["messages", "responses"],
)
async def test_a_request_translated_to_chat_reserves_at_least_what_the_engine_counts_of_the_chat(
    server: str, api: Api, body: dict[str, Any]
) -> None:
    """The gateway sends an engine without the API the translation's chat body (gateway/translation.py)."""
    chat = json.loads(Translation(api.name, body, MODEL).body)
    assert await _counted(server, "/v1/chat/completions", chat) <= _reserved(api, body)
