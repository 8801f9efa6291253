"""The SDK clients docs/gateway.md's Clients section makes reach the gateway as written."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest

from . import docs
from .conftest import SIM, Key, System, Usage

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.usefixtures("llama_server"),
]


async def test_the_sdk_clients_the_docs_make_get_a_message_and_a_response(system: System, key: Key) -> None:
    made: dict[str, Any] = {}
    exec(docs.sdk_lines(system.url, key.plaintext), made)
    claude, gpt = made["claude"], made["gpt"]
    assert isinstance(claude, anthropic.Anthropic) and isinstance(gpt, openai.OpenAI)
    # The synchronous clients the docs make, each in a thread: the loop serves the gateway meanwhile.
    message = await asyncio.to_thread(
        claude.messages.create, model=SIM, max_tokens=4, messages=[{"role": "user", "content": "Hello there"}]
    )
    response = await asyncio.to_thread(
        gpt.responses.create, model=SIM, input="Hello there", max_output_tokens=4
    )
    assert message.content[0].text == response.output_text == "Hello there"
    await system.charged(
        key,
        Usage(
            2,
            message.usage.input_tokens + response.usage.input_tokens,
            message.usage.output_tokens + response.usage.output_tokens,
        ),
    )
