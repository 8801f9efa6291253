"""OpenAI's Responses API onto chat completions and back, judged by the openai SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.translate import TranslationError
from llmgw.translate.responses import ResponsesStream, reply_from_chat, request_to_chat

from . import chunks
from .chunks import DONE, chunk, usage
from .sdk import checked_response, checked_response_stream, response_events

PNG_URL = "data:image/png;base64,iVBORw0KGgo="
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


def completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 18, "completion_tokens": 8, "total_tokens": 26},
    }


def streamed(events: list[bytes], request: dict[str, Any] | None = None) -> tuple[bytes, ResponsesStream]:
    stream = ResponsesStream("tiny", request=request)
    body = b"".join(stream.feed(e) for e in events)
    return body + stream.finish(), stream


def validated(body: bytes) -> list[dict[str, Any]]:
    """Every event, validated by the SDK's types and numbered from 0 in order."""
    return response_events(body)


class TestRequest:
    def test_a_string_input_with_instructions_becomes_system_and_user_messages(self) -> None:
        chat = request_to_chat(
            {
                "model": "tiny",
                "instructions": "Be brief.",
                "input": "hi",
                "max_output_tokens": 64,
                "temperature": 0.2,
                "top_p": 0.9,
                "metadata": {"k": "v"},
                "truncation": "auto",
                "include": ["reasoning.encrypted_content"],
            }
        )
        assert chat == {
            "model": "tiny",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "max_tokens": 64,
            "temperature": 0.2,
            "top_p": 0.9,
        }

    def test_a_streamed_request_asks_the_engine_for_its_usage(self) -> None:
        chat = request_to_chat({"model": "m", "input": "hi", "stream": True})
        assert (chat["stream"], chat["stream_options"]) == (True, {"include_usage": True})

    def test_items_with_text_images_calls_and_their_outputs_become_chat_messages(self) -> None:
        items = [
            {"role": "developer", "content": "Use tools."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather here?"},
                    {"type": "input_image", "image_url": PNG_URL, "detail": "low"},
                ],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Call it."}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "call_2",
                "name": "get_weather",
                "arguments": '{"city": "Rome"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "21C"}],
            },
        ]
        chat = request_to_chat({"model": "m", "input": items, "tools": [WEATHER], "tool_choice": "required"})
        assert chat["messages"] == [
            {"role": "system", "content": "Use tools."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather here?"},
                    {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Let me look.",
                "reasoning_content": "Call it.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "21C"},
        ]
        assert chat["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": WEATHER["parameters"],
                    "description": "The weather in a city",
                    "strict": True,
                },
            }
        ]
        assert chat["tool_choice"] == "required"

    def test_a_function_call_with_no_message_before_it_is_an_assistant_turn_of_its_own(self) -> None:
        items = [
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]
        messages = request_to_chat({"model": "m", "input": items})["messages"]
        assert messages[1] == {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }

    def test_a_function_named_in_tool_choice_is_chats_function_choice(self) -> None:
        chat = request_to_chat({"model": "m", "input": "x", "tool_choice": {"type": "function", "name": "f"}})
        assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}

    def test_a_json_schema_format_becomes_response_format(self) -> None:
        fmt = {"type": "json_schema", "name": "city", "schema": {"type": "object"}, "strict": True}
        chat = request_to_chat({"model": "m", "input": "x", "text": {"format": fmt}})
        assert chat["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": {"type": "object"}, "strict": True},
        }
        nameless = request_to_chat(
            {"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}
        )
        assert nameless["response_format"]["json_schema"] == {"name": "output", "schema": {}}
        assert "response_format" not in request_to_chat(
            {"model": "m", "input": "x", "text": {"format": {"type": "text"}}}
        )

    def test_reasoning_effort_is_passed_on(self) -> None:
        assert (
            request_to_chat({"model": "m", "input": "x", "reasoning": {"effort": "low"}})["reasoning_effort"]
            == "low"
        )

    def test_an_effort_chat_completions_do_not_take_is_left_to_the_engine(self) -> None:
        assert "reasoning_effort" not in request_to_chat(
            {"model": "m", "input": "x", "reasoning": {"effort": "xhigh"}}
        )

    def test_no_reasoning_effort_asks_the_template_not_to_think(self) -> None:
        chat = request_to_chat({"model": "m", "input": "x", "reasoning": {"effort": "none"}})
        assert chat["chat_template_kwargs"] == {"enable_thinking": False}
        assert "reasoning_effort" not in chat

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("previous_response_id", "resp_1"),
            ("store", True),
            ("conversation", "conv_1"),
            ("background", True),
        ],
    )
    def test_what_needs_a_stored_response_is_refused_in_words(self, field: str, value: object) -> None:
        with pytest.raises(TranslationError) as caught:
            request_to_chat({"model": "m", "input": "x", field: value})
        assert caught.value.param == field
        assert caught.value.message.startswith(f"{field}: ")
        if field != "background":
            assert "keeps no responses" in caught.value.message

    def test_store_false_is_what_a_translated_engine_does_anyway(self) -> None:
        assert request_to_chat({"model": "m", "input": "x", "store": False})["messages"] == [
            {"role": "user", "content": "x"}
        ]

    def test_a_built_in_tool_is_left_out_as_llama_servers_own_route_leaves_it(self) -> None:
        # Codex offers web search to every model; no engine can run it, and refusing it refused Codex.
        chat = request_to_chat(
            {
                "model": "m",
                "input": "x",
                "tools": [WEATHER, {"type": "web_search", "external_web_access": False}],
            }
        )
        assert [tool["function"]["name"] for tool in chat["tools"]] == ["get_weather"]

    def test_an_unknown_item_is_refused_naming_where_it_is(self) -> None:
        with pytest.raises(TranslationError, match=r"input\.1: .*'item_reference' item"):
            request_to_chat(
                {
                    "model": "m",
                    "input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "m"}],
                }
            )

    def test_a_file_is_refused(self) -> None:
        content = [{"type": "input_file", "file_id": "file-1"}]
        with pytest.raises(TranslationError, match=r"input\.0\.content\.0: .*'input_file' part"):
            request_to_chat({"model": "m", "input": [{"role": "user", "content": content}]})

    def test_an_image_uploaded_to_openai_is_refused(self) -> None:
        content = [{"type": "input_image", "file_id": "file-1", "detail": "auto"}]
        with pytest.raises(TranslationError, match="files uploaded to OpenAI"):
            request_to_chat({"model": "m", "input": [{"role": "user", "content": content}]})


class TestReply:
    def test_a_plain_answer_is_a_completed_response_with_one_message(self) -> None:
        request = {
            "model": "tiny",
            "input": "hi",
            "instructions": "Be brief.",
            "max_output_tokens": 64,
            "metadata": {"k": "v"},
        }
        response = checked_response(
            reply_from_chat(completion({"content": "Hi there."}), "tiny", request=request)
        )
        assert response.id.startswith("resp_")
        assert response.status == "completed"
        assert response.output_text == "Hi there."
        assert (response.instructions, response.max_output_tokens, response.metadata) == (
            "Be brief.",
            64,
            {"k": "v"},
        )
        assert response.usage is not None
        assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (
            18,
            8,
            26,
        )

    def test_tool_calls_become_function_call_items(self) -> None:
        calls = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ]
        response = checked_response(
            reply_from_chat(
                completion({"content": None, "tool_calls": calls}, "tool_calls"),
                "tiny",
                request={"tools": [WEATHER]},
            )
        )
        [item] = response.output
        assert item.type == "function_call"
        assert (item.call_id, item.name, json.loads(item.arguments)) == (
            "call_1",
            "get_weather",
            {"city": "Paris"},
        )
        assert item.id is not None and item.id.startswith("fc_")
        assert response.tools[0].type == "function"

    def test_a_reply_cut_at_the_token_limit_is_incomplete(self) -> None:
        response = checked_response(reply_from_chat(completion({"content": "Hi"}, "length"), "tiny"))
        assert response.status == "incomplete"
        assert (
            response.incomplete_details is not None
            and response.incomplete_details.reason == "max_output_tokens"
        )

    def test_the_engines_reasoning_is_a_reasoning_item_before_the_message(self) -> None:
        response = checked_response(
            reply_from_chat(completion({"content": "Hi", "reasoning_content": "Greet."}), "tiny")
        )
        assert [item.type for item in response.output] == ["reasoning", "message"]
        reasoning = response.output[0]
        assert reasoning.type == "reasoning" and reasoning.content is not None
        assert reasoning.content[0].text == "Greet."

    def test_cached_and_reasoning_tokens_are_counted_in_their_totals_and_details(self) -> None:
        chat = completion({"content": "Hi"})
        chat["usage"]["prompt_tokens_details"] = {"cached_tokens": 10}
        chat["usage"]["completion_tokens_details"] = {"reasoning_tokens": 5}
        usage = checked_response(reply_from_chat(chat, "tiny")).usage
        assert usage is not None
        assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (18, 10)
        assert (usage.output_tokens, usage.output_tokens_details.reasoning_tokens) == (8, 5)


class TestStream:
    def test_a_plain_answer_streams_the_typed_events_in_order(self) -> None:
        body, stream = streamed(chunks.TEXT)
        events = validated(body)
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        response, _ = checked_response_stream(body)
        assert response.output_text == "Hi there."
        assert response.usage is not None and (response.usage.input_tokens, response.usage.output_tokens) == (
            18,
            8,
        )
        assert (stream.prompt_tokens, stream.completion_tokens, stream.finished) == (18, 8, True)

    def test_tool_calls_split_over_chunks_stream_their_arguments(self) -> None:
        body, _ = streamed(chunks.TOOLS)
        events = validated(body)
        deltas = [
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == 1
        ]
        assert deltas == ['{"ci', 'ty": "Par', 'is"}']
        done = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
        assert [json.loads(d) for d in done] == [{"city": "Paris"}, {"zone": "CET"}]
        response, _ = checked_response_stream(body)
        assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
        calls = [item for item in response.output if item.type == "function_call"]
        assert [(c.call_id, c.name) for c in calls] == [("call_a", "get_weather"), ("call_b", "get_time")]

    def test_reasoning_streams_as_a_reasoning_item(self) -> None:
        body, _ = streamed(chunks.REASONING)
        events = validated(body)
        assert "response.reasoning_text.delta" in [e["type"] for e in events]
        response, _ = checked_response_stream(body)
        assert [item.type for item in response.output] == ["reasoning", "message"]
        assert response.output_text == "Hello!"

    def test_the_request_is_echoed_in_the_created_and_completed_responses(self) -> None:
        request = {"model": "tiny", "input": "hi", "instructions": "Be brief.", "tools": [WEATHER]}
        events = validated(streamed(chunks.TEXT, request)[0])
        for event in (events[0], events[-1]):
            assert event["response"]["instructions"] == "Be brief."
            assert event["response"]["tools"] == [WEATHER]
        assert events[0]["response"]["status"] == "in_progress"

    def test_a_stream_cut_at_the_token_limit_ends_incomplete(self) -> None:
        body, _ = streamed([chunk({"content": "Hi"}), chunk(finish="length"), usage(3, 1), DONE])
        last = validated(body)[-1]
        assert last["type"] == "response.incomplete"
        assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
        assert last["response"]["usage"]["output_tokens"] == 1

    def test_a_stream_ending_without_done_after_its_finish_completes(self) -> None:
        body, _ = streamed(chunks.TEXT[:-1])
        assert validated(body)[-1]["type"] == "response.completed"
        assert checked_response_stream(body)[0].output_text == "Hi there."

    def test_a_stream_cut_before_its_finish_fails_with_what_was_said(self) -> None:
        body, stream = streamed(chunks.TEXT[:3])
        last = validated(body)[-1]
        assert last["type"] == "response.failed"
        assert last["response"]["status"] == "failed"
        # The engine said no usage: unknown, not a reply that cost nothing.
        assert last["response"]["usage"] is None
        assert last["response"]["error"] == {
            "code": "server_error",
            "message": "the engine's stream ended before the reply was complete",
        }
        assert stream.finished

    def test_an_engines_error_event_mid_stream_fails_the_response(self) -> None:
        failure = json.dumps({"error": {"message": "KV cache is full"}}).encode()
        body, _ = streamed([*chunks.TEXT[:2], failure, chunk({"content": "late"})])
        last = validated(body)[-1]
        assert last["type"] == "response.failed"
        assert last["response"]["error"]["message"] == "the engine failed mid-stream: KV cache is full"

    def test_the_gateways_own_failure_before_any_chunk_still_starts_the_response(self) -> None:
        stream = ResponsesStream("tiny")
        events = validated(stream.error_event("the engine stalled"))
        assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
        assert stream.feed(chunks.TEXT[1]) == b""


class TestOddInput:
    def test_reasoning_with_content_of_another_shape_is_skipped(self) -> None:
        items = [
            {"type": "reasoning", "content": 5, "summary": [{"type": "summary_text", "text": "Think."}]},
            {"role": "assistant", "content": "Hi"},
        ]
        assert request_to_chat({"model": "m", "input": items})["messages"] == [
            {"role": "assistant", "content": "Hi", "reasoning_content": "Think."}
        ]

    def test_a_tool_output_sent_as_an_object_reaches_the_model_as_its_json(self) -> None:
        items = [{"type": "function_call_output", "call_id": "c", "output": {"temp": 18}}]
        assert request_to_chat({"model": "m", "input": items})["messages"] == [
            {"role": "tool", "tool_call_id": "c", "content": '{"temp": 18}'}
        ]

    @pytest.mark.parametrize("value", [0, -1, "64", 1.5, True])
    def test_a_token_limit_that_is_not_a_positive_whole_number_is_refused(self, value: object) -> None:
        with pytest.raises(
            TranslationError, match="max_output_tokens: must be a whole number of at least 1"
        ) as caught:
            request_to_chat({"model": "m", "input": "x", "max_output_tokens": value})
        assert caught.value.param == "max_output_tokens"

    def test_instructions_that_are_not_text_are_refused(self) -> None:
        with pytest.raises(TranslationError, match="instructions: must be a string"):
            request_to_chat({"model": "m", "input": "x", "instructions": [{"role": "system"}]})


def test_a_codex_turn_translates_with_only_what_the_model_reads() -> None:
    """Shaped as Codex CLI sends a turn with store off: developer and user messages, its shell tool,
    a past reasoning item with its summary, a call and its output."""
    shell = {
        "type": "function",
        "name": "shell",
        "description": "Runs a command",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        },
    }
    body = {
        "model": "tiny",
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "<permissions>ask</permissions>"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Run ls."}],
                "encrypted_content": "gAAA",
            },
            {
                "type": "function_call",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
                "call_id": "call_1",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
        ],
        "tools": [shell],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-session",
        "text": {"verbosity": "medium"},
    }
    chat = request_to_chat(body)
    assert chat == {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "You are Codex.\n\n<permissions>ask</permissions>"},
            {"role": "user", "content": "list files"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Run ls.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "shell", "arguments": '{"command":["ls"]}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "README.md"},
        ],
        "parallel_tool_calls": False,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "shell",
                    "parameters": shell["parameters"],
                    "description": "Runs a command",
                    "strict": False,
                },
            }
        ],
        "tool_choice": "auto",
        "reasoning_effort": "medium",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


# Shaped as Codex CLI 0.171 offers its sub-agent tools, and as OpenAI declares a freeform tool.
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "close_agent",
            "description": "Close an agent",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"target": {"type": "string"}},
                "required": ["target"],
                "additionalProperties": False,
            },
        },
        {"type": "custom", "name": "note", "description": "Takes a note"},
    ],
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edits files",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}
TOOLED = {"model": "tiny", "input": "x", "tools": [WEATHER, AGENTS, PATCH]}


def chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class TestNamespacesAndCustomTools:
    def test_a_namespaces_tools_become_chat_functions_named_with_their_namespace(self) -> None:
        tools = request_to_chat(TOOLED)["tools"]
        assert [tool["function"]["name"] for tool in tools] == [
            "get_weather",
            "multi_agent_v1__close_agent",
            "multi_agent_v1__note",
            "apply_patch",
        ]
        assert tools[1]["function"] == {
            "name": "multi_agent_v1__close_agent",
            "description": "Close an agent",
            "parameters": AGENTS["tools"][0]["parameters"],  # type: ignore[index]
            "strict": False,
        }

    def test_a_custom_tool_is_a_function_taking_its_text_as_input_with_its_grammar_told(self) -> None:
        patch = request_to_chat(TOOLED)["tools"][3]["function"]
        assert patch["parameters"]["properties"].keys() == {"input"}
        assert patch["parameters"]["required"] == ["input"]
        assert patch["description"] == "Edits files\n\nThe input follows this lark grammar:\nstart: /.+/"

    def test_two_tools_the_model_would_call_by_one_name_are_refused(self) -> None:
        clash = {**WEATHER, "name": "multi_agent_v1__close_agent"}
        with pytest.raises(TranslationError, match=r"tools\.1\.tools\.0: .*'multi_agent_v1__close_agent'"):
            request_to_chat({**TOOLED, "tools": [clash, AGENTS]})

    def test_a_namespace_holding_a_built_in_tool_is_refused(self) -> None:
        inside = {**AGENTS, "tools": [{"type": "web_search"}]}
        with pytest.raises(TranslationError, match=r"tools\.0\.tools\.0: a namespace holds function"):
            request_to_chat({**TOOLED, "tools": [inside]})

    def test_past_namespaced_and_custom_calls_reach_the_model_by_their_chat_names(self) -> None:
        body = {
            **TOOLED,
            "input": [
                {"type": "message", "role": "user", "content": "go"},
                {
                    "type": "function_call",
                    "namespace": "multi_agent_v1",
                    "name": "close_agent",
                    "arguments": '{"target":"a1"}',
                    "call_id": "call_1",
                },
                {
                    "type": "custom_tool_call",
                    "name": "apply_patch",
                    "input": "*** Begin",
                    "call_id": "call_2",
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "closed"},
                {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done"},
            ],
        }
        messages = request_to_chat(body)["messages"]
        assert messages[1] == {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                chat_call("call_1", "multi_agent_v1__close_agent", '{"target":"a1"}'),
                chat_call("call_2", "apply_patch", '{"input": "*** Begin"}'),
            ],
        }
        assert messages[2:] == [
            {"role": "tool", "tool_call_id": "call_1", "content": "closed"},
            {"role": "tool", "tool_call_id": "call_2", "content": "done"},
        ]

    def test_the_models_calls_come_back_as_the_items_their_tools_were_given_as(self) -> None:
        calls = [
            chat_call("call_1", "multi_agent_v1__close_agent", '{"target":"a1"}'),
            chat_call("call_2", "apply_patch", '{"input": "*** Begin"}'),
            chat_call("call_3", "multi_agent_v1__note", "not an object"),
        ]
        response = checked_response(
            reply_from_chat(
                completion({"content": None, "tool_calls": calls}, "tool_calls"), "tiny", request=TOOLED
            )
        )
        first, second, third = response.output
        assert first.type == "function_call"
        assert (first.namespace, first.name, first.arguments) == (
            "multi_agent_v1",
            "close_agent",
            '{"target":"a1"}',
        )
        assert second.type == "custom_tool_call"
        assert (second.namespace, second.name, second.input, second.call_id) == (
            None,
            "apply_patch",
            "*** Begin",
            "call_2",
        )
        # What the model wrote when it did not write the object reaches the tool as it came.
        assert third.type == "custom_tool_call"
        assert (third.namespace, third.name, third.input) == ("multi_agent_v1", "note", "not an object")
        assert [tool.type for tool in response.tools] == ["function", "namespace", "custom"]

    def test_streamed_calls_come_back_as_the_items_their_tools_were_given_as(self) -> None:
        events = [
            chunk({"role": "assistant", "content": None}),
            chunk({"tool_calls": [chunks.call(0, id="call_1", name="multi_agent_v1__close_agent")]}),
            chunk({"tool_calls": [chunks.call(0, arguments='{"target":')]}),
            chunk({"tool_calls": [chunks.call(0, arguments='"a1"}')]}),
            chunk(
                {"tool_calls": [chunks.call(1, id="call_2", name="apply_patch", arguments='{"input": "*** ')]}
            ),
            chunk({"tool_calls": [chunks.call(1, arguments='Begin"}')]}),
            chunk(finish="tool_calls"),
            usage(40, 21),
            DONE,
        ]
        body, _ = streamed(events, TOOLED)
        kinds = [e["type"] for e in validated(body)]
        assert kinds.count("response.function_call_arguments.delta") == 2
        assert kinds.count("response.custom_tool_call_input.delta") == 1
        assert "response.custom_tool_call_input.done" in kinds
        response, _ = checked_response_stream(body)
        call, custom = response.output
        assert call.type == "function_call" and custom.type == "custom_tool_call"
        assert (call.namespace, call.name, call.arguments) == (
            "multi_agent_v1",
            "close_agent",
            '{"target":"a1"}',
        )
        assert (custom.name, custom.input, custom.call_id) == ("apply_patch", "*** Begin", "call_2")
