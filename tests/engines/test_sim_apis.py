"""The sim engine's Messages, Responses, rerank and transcription routes, as their clients read them."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseStreamEvent
from pydantic import TypeAdapter

from llmgw.engines.sim_apis import minimal_value
from llmgw.engines.sim_server import make_sim_app

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]
MODEL = "sim-chat"


@pytest.fixture
async def sim(aiohttp_client: MakeClient) -> Client:
    return await aiohttp_client(make_sim_app(MODEL, ttft_ms=1, tokens_per_s=1000))


async def test_a_messages_body_without_max_tokens_is_refused_in_anthropics_shape(sim: Client) -> None:
    reply = await sim.post(
        "/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    )
    assert reply.status == 400
    assert await reply.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }


async def test_count_tokens_counts_the_system_prompt_and_every_turn(sim: Client) -> None:
    body = {
        "model": MODEL,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": "one two"},
            {"role": "assistant", "content": [{"type": "text", "text": "three"}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "four five"}],
            },
        ],
    }
    reply = await sim.post("/v1/messages/count_tokens", json=body)
    assert await reply.json() == {"input_tokens": 7}


async def test_a_paced_messages_stream_sends_one_delta_per_token_between_start_and_stop(sim: Client) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "a b c"}],
    }
    reply = await sim.post("/v1/messages", json=body)
    events = [e.split("\n")[0].removeprefix("event: ") for e in (await reply.text()).strip().split("\n\n")]
    assert events == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_a_responses_stream_numbers_its_events_in_order(sim: Client) -> None:
    reply = await sim.post("/v1/responses", json={"model": MODEL, "input": "a b", "stream": True})
    data = [json.loads(e.split("\ndata: ")[1]) for e in (await reply.text()).strip().split("\n\n")]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert data[-1]["type"] == "response.completed"
    assert data[-1]["response"]["usage"]["output_tokens"] == 2


LOOKUP = {
    "type": "function",
    "name": "lookup",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1},
            "units": {"enum": ["metric", "imperial"]},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "note": {"type": "string"},
        },
        "required": ["city", "days", "units", "tags"],
    },
}
LOOKUP_ARGUMENTS = {"city": "", "days": 1, "units": "metric", "tags": [""]}


def test_the_least_value_of_a_schema_holds_only_what_it_requires() -> None:
    assert minimal_value(LOOKUP["parameters"]) == LOOKUP_ARGUMENTS
    assert minimal_value({"type": ["null", "boolean"]}) is False
    assert minimal_value({"anyOf": [{"type": "number"}, {"type": "string"}]}) == 0
    assert minimal_value({"const": "x"}) == "x"


@pytest.mark.parametrize(
    "tool_choice", [{"type": "function", "name": "lookup"}, "required"], ids=["named", "required"]
)
async def test_a_forced_tool_choice_makes_a_responses_reply_a_function_call(
    sim: Client, tool_choice: object
) -> None:
    other = {"type": "function", "name": "other", "parameters": {"type": "object", "properties": {}}}
    tools = [LOOKUP, other] if tool_choice == "required" else [other, LOOKUP]
    body = {"model": MODEL, "input": "a b c", "tools": tools, "tool_choice": tool_choice}
    reply = await sim.post("/v1/responses", json=body)
    response = Response.model_validate(await reply.json())
    (call,) = response.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.name, call.status, json.loads(call.arguments)) == ("lookup", "completed", LOOKUP_ARGUMENTS)
    assert call.call_id and call.call_id != call.id
    assert response.status == "completed" and response.output_text == ""
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 0)


async def test_auto_tool_choice_leaves_a_responses_reply_text(sim: Client) -> None:
    body = {"model": MODEL, "input": "a b c", "tools": [LOOKUP], "tool_choice": "auto"}
    reply = await sim.post("/v1/responses", json=body)
    assert Response.model_validate(await reply.json()).output_text == "a b c"


async def test_a_streamed_function_call_sends_its_arguments_and_completes_with_usage(sim: Client) -> None:
    body = {
        "model": MODEL,
        "input": "a b c",
        "tools": [LOOKUP],
        "tool_choice": {"type": "function", "name": "lookup"},
        "stream": True,
    }
    reply = await sim.post("/v1/responses", json=body)
    adapter: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
    events = [
        adapter.validate_json(e.split("\ndata: ")[1]) for e in (await reply.text()).strip().split("\n\n")
    ]
    assert [e.type for e in events] == [
        "response.created",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    _, added, delta, done, item_done, completed = events
    assert added.type == "response.output_item.added" and added.item.type == "function_call"
    assert added.item.status == "in_progress" and added.item.arguments == ""
    assert delta.type == "response.function_call_arguments.delta"
    assert done.type == "response.function_call_arguments.done"
    assert json.loads(delta.delta) == json.loads(done.arguments) == LOOKUP_ARGUMENTS
    assert item_done.type == "response.output_item.done" and item_done.item.type == "function_call"
    assert delta.item_id == done.item_id == item_done.item.id == added.item.id
    assert completed.type == "response.completed" and completed.response.usage is not None
    assert completed.response.output == [item_done.item]
    assert completed.response.usage.input_tokens == 3


async def test_a_forced_messages_tool_use_takes_the_least_input_its_schema_allows(sim: Client) -> None:
    tool = {"name": "lookup", "input_schema": LOOKUP["parameters"]}
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "tools": [tool],
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "a"}],
    }
    reply = await sim.post("/v1/messages", json=body)
    (block,) = (await reply.json())["content"]
    assert (block["type"], block["input"]) == ("tool_use", LOOKUP_ARGUMENTS)


CHAT_LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP["parameters"]}}


async def test_a_chat_completion_forced_to_call_a_function_answers_with_its_tool_call(sim: Client) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a b c"}],
        "tools": [CHAT_LOOKUP],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
    }
    reply = ChatCompletion.model_validate(await (await sim.post("/v1/chat/completions", json=body)).json())
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "lookup"
    assert json.loads(call.function.arguments) == LOOKUP_ARGUMENTS
    assert reply.usage is not None and (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 0)


async def test_a_streamed_chat_completion_sends_a_required_call_in_one_chunk(sim: Client) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a b c"}],
        "tools": [CHAT_LOOKUP],
        "tool_choice": "required",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text = await (await sim.post("/v1/chat/completions", json=body)).text()
    events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    role, call, finish, usage = (ChatCompletionChunk.model_validate_json(e) for e in events[:-1])
    assert role.choices[0].delta.role == "assistant"
    (delta,) = call.choices[0].delta.tool_calls or []
    assert (delta.index, delta.type) == (0, "function") and delta.id and delta.function is not None
    assert delta.function.name == "lookup"
    assert json.loads(delta.function.arguments or "") == LOOKUP_ARGUMENTS
    assert finish.choices[0].finish_reason == "tool_calls"
    assert usage.usage is not None and usage.usage.completion_tokens == 0


async def test_rerank_returns_documents_when_asked_and_keeps_ties_in_order(sim: Client) -> None:
    body = {"model": MODEL, "query": "x", "documents": [{"text": "y"}, "z"], "return_documents": True}
    reply = await (await sim.post("/v1/rerank", json=body)).json()
    assert reply["results"] == [
        {"index": 0, "relevance_score": 0.0, "document": {"text": "y"}},
        {"index": 1, "relevance_score": 0.0, "document": {"text": "z"}},
    ]


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ("text", "sim heard 64000 bytes of audio\n"),
        ("verbose_json", {"duration": 2.0, "usage": {"type": "duration", "seconds": 2.0}}),
    ],
)
async def test_a_transcription_says_its_audio_in_the_format_asked(
    sim: Client, response_format: str, expected: object
) -> None:
    form = aiohttp.FormData({"model": MODEL, "response_format": response_format})
    form.add_field("file", b"\0" * 64000, filename="a.wav", content_type="audio/wav")
    reply = await sim.post("/v1/audio/transcriptions", data=form)
    assert reply.status == 200
    if isinstance(expected, str):
        assert await reply.text() == expected
    else:
        said = await reply.json()
        assert {k: said[k] for k in ("duration", "usage")} == expected
