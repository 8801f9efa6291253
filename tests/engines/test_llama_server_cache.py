"""A real llama-server, started with the adapter's command line, keeps the conversations sent to it.

What the gateway's `prefix` and `affinity` routing save depends on it: a conversation's next turn
costs only its new messages on the replica that served the last one, even when that replica has
served more conversations than it has slots, and they share a system prompt. Skipped, saying how
to build it, without the llama-server build in the cache.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from llmgw.engines.base import LaunchSpec
from llmgw.engines.llamacpp import LlamaCppEngine

from .test_llama_server import BUILD, _free_port, _wait_healthy, tiny_model

__all__ = ["tiny_model"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        BUILD is None, reason="no llama-server build: run scripts/build-llama-server.sh first"
    ),
]

SLOTS = 2
SYSTEM = " ".join(f"Rule {i}: answer the engineer in full sentences." for i in range(30))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def two_slots(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """llama-server serving the tiny model with two slots of 1,024 tokens; its base URL."""
    assert BUILD is not None
    engine = LlamaCppEngine()
    spec = LaunchSpec(
        model="tiny-chat",
        port=_free_port(),
        model_path=str(tiny_model),
        context_size=1024 * SLOTS,
        parallel=SLOTS,
        binary=str(BUILD / "bin" / "llama-server"),
        args=("--threads", "2"),
    )
    log = tmp_path_factory.mktemp("llama-cache") / "llama-server.log"
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


async def test_later_turns_of_more_conversations_than_slots_prefill_only_their_new_messages(
    two_slots: str,
) -> None:
    """Four conversations under one system prompt, in no fixed order, on two slots."""
    conversations = 4
    histories = [[{"role": "system", "content": SYSTEM}] for _ in range(conversations)]
    previous = [0] * conversations
    rng = random.Random(1)
    reprefilled: list[str] = []
    async with aiohttp.ClientSession() as session:
        for turn in range(3):
            order = list(range(conversations))
            rng.shuffle(order)
            for c in order:
                words = " ".join(rng.choice(["slot", "cache", "prompt", "engine"]) for _ in range(40))
                histories[c].append({"role": "user", "content": f"Conversation {c}, turn {turn}: {words}"})
                body = {"model": "tiny-chat", "messages": histories[c], "max_tokens": 4, "temperature": 0}
                async with session.post(two_slots + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    reply = await resp.json()
                histories[c].append(
                    {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}
                )
                sent, processed = reply["usage"]["prompt_tokens"], reply["timings"]["prompt_n"]
                # New: the last reply (re-tokenized, it may differ from the tokens generated) and
                # this turn's message. Anything past that is history prefilled again.
                if turn and processed > sent - previous[c] + 16:
                    reprefilled.append(f"conversation {c} turn {turn}: {processed} of {sent} tokens")
                previous[c] = sent
    assert not reprefilled
