"""OpenAI's official Python SDK's Responses API through the gateway, to llama-server and to the sim engine.

The SDK pointed at the gateway's /v1 with an llmgw key, as an application (or
the Agents SDK) points it, and what each call cost read back from the store:
the usage charged is `response.usage`, from the reply or `response.completed`.
"""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import FunctionToolParam

from .conftest import MODELS, SIM, TINY, Key, System, Usage

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.usefixtures("llama_server"),
]

WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}

CITY = '{"city": "Paris"}'


@pytest.fixture(params=MODELS)
def model(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _client(system: System, key: Key) -> openai.AsyncOpenAI:
    # No retries: a refusal is the test's to see, not the SDK's to hide.
    return openai.AsyncOpenAI(base_url=f"{system.url}/v1", api_key=key.plaintext, max_retries=0)


def _usage(response: openai.types.responses.Response) -> tuple[int, int]:
    assert response.usage is not None
    return response.usage.input_tokens, response.usage.output_tokens


async def test_a_response_comes_back_and_the_store_charges_its_usage(
    system: System, key: Key, model: str
) -> None:
    async with _client(system, key) as client:
        response = await client.responses.create(
            model=model, instructions="Answer briefly.", input="Hello there", max_output_tokens=16
        )
    assert (response.object, response.status, response.model) == ("response", "completed", model)
    assert response.output_text == ("Hi there." if model == TINY else "Hello there")
    prompt, completion = _usage(response)
    assert prompt > 0 and completion > 0
    await system.charged(key, Usage(1, prompt, completion))


async def test_a_streamed_response_ends_with_response_completed_and_is_charged_its_usage(
    system: System, key: Key, model: str
) -> None:
    async with _client(system, key) as client:
        stream = await client.responses.create(
            model=model, input="Hello there", max_output_tokens=16, stream=True
        )
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == ("Hi there." if model == TINY else "Hello there")
    final = events[-1]
    assert final.type == "response.completed"
    await system.charged(key, Usage(1, *_usage(final.response)))


async def test_the_sdks_stream_helper_assembles_the_response(system: System, key: Key, model: str) -> None:
    """`responses.stream()`, which rebuilds the response from its events (the Agents SDK reads turns so).

    llama-server b11434's own Responses events carry no `content_index`, which the helper indexes the
    response's parts by (a TypeError): the gateway translates its Responses from chat instead.
    """
    async with (
        _client(system, key) as client,
        client.responses.stream(model=model, input="Hello there", max_output_tokens=16) as stream,
    ):
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds[-1] == "response.completed"
    assert final.output_text == ("Hi there." if model == TINY else "Hello there")
    await system.charged(key, Usage(1, *_usage(final)))


async def test_a_function_calls_output_goes_back_with_the_tools_and_is_answered(
    system: System, key: Key, model: str
) -> None:
    """The second half of a function call, as the client sends it: the call, then its output.

    llama-server does not make the call itself here: it builds a call's grammar from the model's
    chat template, which the tiny model lacks. The sim engine's whole round trip is the next test.
    """
    async with _client(system, key) as client:
        answered = await client.responses.create(
            model=model,
            input=[
                {"role": "user", "content": "What is the weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": "call_01",
                    "name": "weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_01", "output": "sunny"},
            ],
            tools=[WEATHER],
            max_output_tokens=16,
        )
    assert answered.status == "completed"
    assert answered.output_text == ("Hi there." if model == TINY else "sunny")
    await system.charged(key, Usage(1, *_usage(answered)))


async def test_a_forced_function_call_comes_back_and_its_output_is_answered_on_the_sim(
    system: System, key: Key
) -> None:
    """The whole round trip: the sim calls the function the request forces, and answers its output."""
    async with _client(system, key) as client:
        called = await client.responses.create(
            model=SIM,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "weather"},
            max_output_tokens=16,
        )
        (call,) = called.output
        assert call.type == "function_call" and call.name == "weather"
        assert json.loads(call.arguments) == {"city": ""}
        answered = await client.responses.create(
            model=SIM,
            input=[
                {"role": "user", "content": "What is the weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            tools=[WEATHER],
            max_output_tokens=16,
        )
    assert called.status == answered.status == "completed"
    assert answered.output_text == "sunny"
    (called_in, called_out), (answered_in, answered_out) = _usage(called), _usage(answered)
    await system.charged(key, Usage(2, called_in + answered_in, called_out + answered_out))


async def test_the_sdks_stream_helper_assembles_a_forced_function_call_on_the_sim(
    system: System, key: Key
) -> None:
    async with (
        _client(system, key) as client,
        client.responses.stream(
            model=SIM,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            max_output_tokens=16,
        ) as stream,
    ):
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": ""}
    await system.charged(key, Usage(1, *_usage(final)))
