"""Anthropic's official Python SDK through the gateway, to llama-server's Messages API and to the sim engine.

Every call as an application makes it, the SDK pointed at the gateway with an
llmgw key as its api_key (sent as `x-api-key`), and what each cost read back from
the store: the usage the gateway charges is the usage the client was told.
"""

from __future__ import annotations

import anthropic
import attrs
import pytest

from .conftest import MODELS, SIM, TINY, Key, System, Usage

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.usefixtures("llama_server"),
]

WEATHER: anthropic.types.ToolParam = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

QUESTION: anthropic.types.MessageParam = {"role": "user", "content": "What is the weather in Paris?"}

# The call a model made, as the client sends it back with the call's result.
CALL: anthropic.types.ToolUseBlockParam = {
    "type": "tool_use",
    "id": "toolu_01",
    "name": "weather",
    "input": {"city": "Paris"},
}


def _result(use_id: str) -> anthropic.types.ToolResultBlockParam:
    return {"type": "tool_result", "tool_use_id": use_id, "content": "sunny"}


@pytest.fixture(params=MODELS)
def model(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _client(system: System, key: Key) -> anthropic.AsyncAnthropic:
    # No retries: a refusal is the test's to see, not the SDK's to hide.
    return anthropic.AsyncAnthropic(base_url=system.url, api_key=key.plaintext, max_retries=0)


def _prompt(usage: anthropic.types.Usage) -> int:
    """The prompt tokens of Anthropic's usage: its input, and what was read from or written to its cache.

    llama-server reports the part of a prompt its slot had cached as `cache_read_input_tokens`.
    """
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached


def _charged(*messages: anthropic.types.Message) -> Usage:
    """What the store charges for these replies."""
    return Usage(
        len(messages),
        sum(_prompt(message.usage) for message in messages),
        sum(message.usage.output_tokens for message in messages),
    )


def _text(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


async def test_a_message_comes_back_and_the_store_charges_its_usage(
    system: System, key: Key, model: str
) -> None:
    async with _client(system, key) as client:
        message = await client.messages.create(
            model=model,
            max_tokens=16,
            system="Answer briefly.",
            messages=[{"role": "user", "content": "Hello there"}],
        )
    assert (message.type, message.role, message.model) == ("message", "assistant", model)
    assert message.stop_reason == "end_turn"
    # The tiny model says only what its grammar lets it; the sim engine echoes the last turn.
    assert _text(message) == ("Hi there." if model == TINY else "Hello there")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    await system.charged(key, _charged(message))


async def test_a_streamed_message_ends_with_message_stop_and_is_charged_what_it_reported(
    system: System, key: Key, model: str
) -> None:
    events: list[str] = []
    async with (
        _client(system, key) as client,
        client.messages.stream(
            model=model, max_tokens=16, messages=[{"role": "user", "content": "Hello there"}]
        ) as stream,
    ):
        async for event in stream:
            events.append(event.type)
        final = await stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_delta" in events and "message_delta" in events
    assert final.stop_reason == "end_turn"
    assert _text(final) == ("Hi there." if model == TINY else "Hello there")
    await system.charged(key, _charged(final))


async def test_counting_tokens_costs_a_request_and_no_tokens(system: System, key: Key, model: str) -> None:
    async with _client(system, key) as client:
        counted = await client.messages.count_tokens(
            model=model, system="Answer briefly.", messages=[{"role": "user", "content": "Hello there"}]
        )
        await system.charged(key, Usage(1, 0, 0))
        # The count is the one the engine gives the same prompt when it is sent.
        message = await client.messages.create(
            model=model,
            max_tokens=4,
            system="Answer briefly.",
            messages=[{"role": "user", "content": "Hello there"}],
        )
    assert counted.input_tokens == _prompt(message.usage)
    await system.charged(key, attrs.evolve(_charged(message), requests=2))


async def test_a_tool_result_goes_back_with_the_tools_and_is_answered(
    system: System, key: Key, model: str
) -> None:
    """The second half of a tool call, as the client sends it: the model's tool_use, then its result.

    The tiny model cannot make the call itself: llama-server builds a tool call's grammar from the
    model's chat template, and the tiny model has none (a request forcing a tool gets text back).
    """
    async with _client(system, key) as client:
        answered = await client.messages.create(
            model=model,
            max_tokens=16,
            tools=[WEATHER],
            messages=[
                QUESTION,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_01", "name": "weather", "input": {"city": "Paris"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}],
                },
            ],
        )
    assert answered.stop_reason == "end_turn"
    assert _text(answered) == ("Hi there." if model == TINY else "sunny")
    await system.charged(key, _charged(answered))


async def test_the_sim_model_calls_a_forced_tool_and_answers_its_result(system: System, key: Key) -> None:
    """The whole round trip, on the engine that makes the call it is told to (the sim's `tool_choice`)."""
    async with _client(system, key) as client:
        called = await client.messages.create(
            model=SIM,
            max_tokens=64,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "weather"},
            messages=[QUESTION],
        )
        (use,) = [block for block in called.content if block.type == "tool_use"]
        assert (use.name, called.stop_reason) == ("weather", "tool_use")
        answered = await client.messages.create(
            model=SIM,
            max_tokens=16,
            tools=[WEATHER],
            messages=[
                QUESTION,
                {"role": "assistant", "content": called.content},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
                },
            ],
        )
    assert (answered.stop_reason, _text(answered)) == ("end_turn", "sunny")
    await system.charged(key, _charged(called, answered))
