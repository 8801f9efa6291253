"""The Messages and Responses routes passed through to a real llama-server, which speaks both itself:
each request charged what the engine's own usage fields say."""

from __future__ import annotations

import pytest

from tests.translate.test_llama_server import server

from .test_apis import MODEL, Rig, _row, rig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("llama_server")]
# The fixtures this module uses from others: llama-server on the tiny model, the gateway in front.
__all__ = ["rig", "server"]


@pytest.fixture
def llama(rig: Rig, server: str) -> Rig:
    rig.replicas.endpoints[MODEL] = [server]
    return rig


async def test_messages_are_charged_their_input_with_cache_reads_and_their_output(llama: Rig) -> None:
    turn = [{"role": "user", "content": "hello there"}]
    async with llama.anthropic() as client:
        plain = await client.messages.create(model=MODEL, max_tokens=8, messages=turn)
        async with client.messages.stream(model=MODEL, max_tokens=8, messages=turn) as stream:
            streamed = await stream.get_final_message()
        counted = await client.messages.count_tokens(model=MODEL, messages=turn)
    # llama-server says Anthropic's usage as Anthropic does: the input it read beside what its cache had.
    prompts = [(u.input_tokens + (u.cache_read_input_tokens or 0)) for u in (plain.usage, streamed.usage)]
    assert prompts == [counted.input_tokens] * 2
    outputs = plain.usage.output_tokens + streamed.usage.output_tokens
    assert _row(await llama.usage()) == (MODEL, 3, sum(prompts), outputs)


async def test_responses_are_charged_the_usage_of_the_reply_and_of_response_completed(llama: Rig) -> None:
    async with llama.openai() as client:
        plain = await client.responses.create(model=MODEL, input="hello there", max_output_tokens=8)
        stream = await client.responses.create(
            model=MODEL, input="hello there", max_output_tokens=8, stream=True
        )
        completed = [event.response async for event in stream if event.type == "response.completed"]
    (last,) = completed
    assert plain.usage is not None and last.usage is not None
    prompt = plain.usage.input_tokens + last.usage.input_tokens
    output = plain.usage.output_tokens + last.usage.output_tokens
    assert _row(await llama.usage()) == (MODEL, 2, prompt, output)
