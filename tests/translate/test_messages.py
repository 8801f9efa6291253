"""Anthropic's Messages API onto chat completions and back, judged by the anthropic SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.translate import TranslationError, UpstreamError
from llmgw.translate.messages import (
    MessagesStream,
    count_tokens_reply,
    count_tokens_request,
    reply_from_chat,
    request_to_chat,
)

from . import chunks
from .chunks import DONE, chunk, usage
from .sdk import anthropic_stream_error, checked_message, checked_message_stream, sse_events

PNG = "iVBORw0KGgo="


def completion(message: dict[str, Any], finish: str = "stop", **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "tiny",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish, **choice}
        ],
        "usage": {"prompt_tokens": 18, "completion_tokens": 8, "total_tokens": 26},
    }


def streamed(events: list[bytes], *, stop_sequences: tuple[str, ...] = ()) -> tuple[bytes, MessagesStream]:
    stream = MessagesStream("tiny", stop_sequences=stop_sequences)
    body = b"".join(stream.feed(e) for e in events)
    return body + stream.finish(), stream


class TestRequest:
    def test_a_system_prompt_and_a_question_become_chat_messages(self) -> None:
        chat = request_to_chat(
            {
                "model": "tiny",
                "max_tokens": 64,
                "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 40,
                "stop_sequences": ["END"],
                "metadata": {"user_id": "u1"},
            }
        )
        assert chat == {
            "model": "tiny",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "max_tokens": 64,
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 40,
            "stop": ["END"],
        }

    def test_a_system_prompt_as_a_string_is_the_system_message(self) -> None:
        chat = request_to_chat({"model": "m", "max_tokens": 1, "system": "Be brief.", "messages": []})
        assert chat["messages"] == [{"role": "system", "content": "Be brief."}]

    def test_system_blocks_are_joined_by_a_blank_line(self) -> None:
        system = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in French."}]
        chat = request_to_chat({"model": "m", "max_tokens": 1, "system": system, "messages": []})
        assert chat["messages"] == [{"role": "system", "content": "You are terse.\n\nAnswer in French."}]

    def test_claude_codes_billing_line_which_changes_every_request_is_left_out(self) -> None:
        """It would make every turn's prompt differ from its first line, and no prefix cache would hold."""
        header = "x-anthropic-billing-header: cc_version=2.1.197.e51; cc_entrypoint=cli; cch=a5145;"
        system = [{"type": "text", "text": header}, {"type": "text", "text": "You are Claude Code."}]
        chat = request_to_chat({"model": "m", "max_tokens": 1, "system": system, "messages": []})
        assert chat["messages"] == [{"role": "system", "content": "You are Claude Code."}]
        chat = request_to_chat(
            {"model": "m", "max_tokens": 1, "system": f"{header}\nYou are terse.", "messages": []}
        )
        assert chat["messages"] == [{"role": "system", "content": "You are terse."}]

    def test_a_streamed_request_asks_the_engine_for_its_usage(self) -> None:
        chat = request_to_chat({"model": "m", "max_tokens": 1, "stream": True, "messages": []})
        assert chat["stream"] is True
        assert chat["stream_options"] == {"include_usage": True}

    def test_a_json_schema_in_output_config_becomes_response_format(self) -> None:
        config = {"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "low"}
        chat = request_to_chat({"model": "m", "max_tokens": 1, "messages": [], "output_config": config})
        assert chat["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": {"type": "object"}},
        }
        assert chat["reasoning_effort"] == "low"
        chat = request_to_chat(
            {"model": "m", "max_tokens": 1, "messages": [], "output_config": {"effort": "max"}}
        )
        assert "reasoning_effort" not in chat

    def test_a_prefilled_reply_is_continued_rather_than_started_again(self) -> None:
        turns = [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}]
        chat = request_to_chat({"model": "m", "max_tokens": 1, "messages": turns})
        assert (chat["continue_final_message"], chat["add_generation_prompt"]) == (True, False)
        chat = request_to_chat({"model": "m", "max_tokens": 1, "messages": turns[:1]})
        assert "continue_final_message" not in chat and "add_generation_prompt" not in chat

    def test_thinking_turned_off_asks_the_template_not_to_think(self) -> None:
        off = {"type": "disabled"}
        chat = request_to_chat({"model": "m", "max_tokens": 1, "messages": [], "thinking": off})
        assert chat["chat_template_kwargs"] == {"enable_thinking": False}
        mine = {"enable_thinking": True, "x": 1}
        chat = request_to_chat(
            {"model": "m", "max_tokens": 1, "messages": [], "thinking": off, "chat_template_kwargs": mine}
        )
        assert chat["chat_template_kwargs"] == mine
        on = {"type": "enabled", "budget_tokens": 2048}
        assert "chat_template_kwargs" not in request_to_chat(
            {"model": "m", "max_tokens": 1, "messages": [], "thinking": on}
        )

    def test_a_request_without_max_tokens_is_refused(self) -> None:
        with pytest.raises(TranslationError) as caught:
            request_to_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert caught.value.param == "max_tokens"
        assert "max_tokens" in caught.value.message

    def test_images_become_image_url_parts(self) -> None:
        content = [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        ]
        chat = request_to_chat(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}
        )
        assert chat["messages"] == [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                ],
            }
        ]

    def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages(self) -> None:
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Here it is."},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "18C"}],
                    },
                ],
            },
        ]
        tools = [
            {
                "name": "get_weather",
                "description": "The weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ]
        chat = request_to_chat(
            {
                "model": "m",
                "max_tokens": 1,
                "messages": messages,
                "tools": tools,
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            }
        )
        assert chat["messages"] == [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "Let me look.",
                "reasoning_content": "I should call the tool.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            # The tool's answer first: chat wants it right after the assistant's call.
            {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
            {"role": "user", "content": "Here it is."},
        ]
        assert chat["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ]
        assert chat["tool_choice"] == "required"
        assert chat["parallel_tool_calls"] is False

    @pytest.mark.parametrize(
        ("choice", "chat"),
        [
            ({"type": "auto"}, "auto"),
            ({"type": "none"}, "none"),
            ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
        ],
    )
    def test_each_tool_choice_has_its_chat_equivalent(self, choice: dict[str, Any], chat: object) -> None:
        assert (
            request_to_chat({"model": "m", "max_tokens": 1, "messages": [], "tool_choice": choice})[
                "tool_choice"
            ]
            == chat
        )

    def test_a_failed_tool_result_says_so_to_the_model(self) -> None:
        result = {"type": "tool_result", "tool_use_id": "t", "content": "no such city", "is_error": True}
        chat = request_to_chat(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [result]}]}
        )
        assert chat["messages"] == [{"role": "tool", "tool_call_id": "t", "content": "Error: no such city"}]

    def test_a_tool_result_with_an_image_keeps_it_as_a_part(self) -> None:
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
        result = {
            "type": "tool_result",
            "tool_use_id": "t",
            "content": [{"type": "text", "text": "shot:"}, image],
        }
        chat = request_to_chat(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [result]}]}
        )
        assert chat["messages"][0]["content"][1] == {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{PNG}"},
        }

    def test_an_unknown_content_block_is_refused_naming_where_it_is(self) -> None:
        document = {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "x"},
        }
        with pytest.raises(TranslationError) as caught:
            request_to_chat(
                {
                    "model": "m",
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, document]}],
                }
            )
        assert "messages.0.content.1" in caught.value.message
        assert "'document'" in caught.value.message
        assert caught.value.param == "messages"

    def test_a_server_tool_is_refused(self) -> None:
        with pytest.raises(TranslationError, match=r"web_search.*server tools") as caught:
            request_to_chat(
                {
                    "model": "m",
                    "max_tokens": 1,
                    "messages": [],
                    "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                }
            )
        assert caught.value.param == "tools"

    def test_an_image_from_anthropics_files_api_is_refused(self) -> None:
        image = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
        with pytest.raises(TranslationError, match="base64 data or a URL"):
            request_to_chat(
                {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [image]}]}
            )

    def test_a_chat_body_sent_to_messages_is_refused(self) -> None:
        with pytest.raises(TranslationError, match=r"messages\.0\.role"):
            request_to_chat(
                {"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "hi"}]}
            )

    def test_count_tokens_asks_tokenize_for_the_prompt_with_its_tools(self) -> None:
        tool = {"name": "f", "input_schema": {"type": "object"}}
        body = count_tokens_request(
            {"model": "m", "system": "s", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
        )
        assert body == {
            "model": "m",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
            "add_generation_prompt": True,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        }
        assert count_tokens_reply({"count": 12, "tokens": [1] * 12}) == {"input_tokens": 12}
        prefilled = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}]
        body = count_tokens_request({"model": "m", "messages": prefilled})
        assert (body["add_generation_prompt"], body["continue_final_message"]) == (False, True)
        assert count_tokens_reply({"tokens": [1, 2, 3]}) == {"input_tokens": 3}


class TestReply:
    def test_a_plain_answer_is_a_message_with_one_text_block(self) -> None:
        reply = reply_from_chat(completion({"content": "Hi there."}), "tiny")
        message = checked_message(reply)
        assert message.id.startswith("msg_")
        assert message.model == "tiny"
        assert [b.model_dump() for b in message.content] == [
            {"type": "text", "text": "Hi there.", "citations": None}
        ]
        assert message.stop_reason == "end_turn"
        assert (message.usage.input_tokens, message.usage.output_tokens) == (18, 8)

    def test_tool_calls_become_tool_use_blocks_with_their_input_parsed(self) -> None:
        calls = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ]
        message = checked_message(
            reply_from_chat(completion({"content": "", "tool_calls": calls}, "tool_calls"), "tiny")
        )
        assert message.stop_reason == "tool_use"
        [block] = message.content
        assert block.type == "tool_use"
        assert (block.id, block.name, block.input) == ("call_1", "get_weather", {"city": "Paris"})

    def test_a_tool_call_the_engine_finished_as_stop_still_stops_for_the_tool(self) -> None:
        calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
        message = checked_message(
            reply_from_chat(completion({"content": None, "tool_calls": calls}, "stop"), "tiny")
        )
        assert message.stop_reason == "tool_use"

    def test_arguments_that_are_not_json_are_kept_whole(self) -> None:
        calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"city": "Par'}}]
        message = checked_message(reply_from_chat(completion({"tool_calls": calls}, "tool_calls"), "tiny"))
        assert message.content[0].type == "tool_use"
        assert message.content[0].input == {"arguments": '{"city": "Par'}

    def test_a_reply_cut_at_max_tokens_says_so(self) -> None:
        assert (
            checked_message(reply_from_chat(completion({"content": "Hi"}, "length"), "tiny")).stop_reason
            == "max_tokens"
        )

    def test_a_stop_sequence_the_engine_names_is_the_replys_stop_sequence(self) -> None:
        reply = reply_from_chat(
            completion({"content": "Hi"}, "stop", stop_reason="END"), "tiny", stop_sequences=["END"]
        )
        message = checked_message(reply)
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")

    def test_a_stop_the_request_did_not_ask_for_is_an_end_of_turn(self) -> None:
        # vLLM names an EOS token id in stop_reason too.
        message = checked_message(
            reply_from_chat(completion({"content": "Hi"}, "stop", stop_reason=2), "tiny")
        )
        assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)

    def test_the_engines_reasoning_is_a_thinking_block_before_the_text(self) -> None:
        message = checked_message(
            reply_from_chat(completion({"content": "Hi", "reasoning_content": "Greet."}), "tiny")
        )
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].type == "thinking" and message.content[0].thinking == "Greet."

    def test_cached_prompt_tokens_are_cache_reads(self) -> None:
        chat = completion({"content": "Hi"})
        chat["usage"]["prompt_tokens_details"] = {"cached_tokens": 10}
        usage = checked_message(reply_from_chat(chat, "tiny")).usage
        assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (8, 10, 8)

    def test_a_reply_without_choices_is_the_engines_failure(self) -> None:
        with pytest.raises(UpstreamError, match="no choices"):
            reply_from_chat({"choices": []}, "tiny")


class TestStream:
    def test_a_plain_answer_streams_as_one_text_block(self) -> None:
        body, stream = streamed(chunks.TEXT)
        names = [name for name, _ in sse_events(body)]
        assert names == [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        message = checked_message_stream(body)
        assert message.content[0].type == "text" and message.content[0].text == "Hi there."
        assert message.stop_reason == "end_turn"
        assert (message.usage.input_tokens, message.usage.output_tokens) == (18, 8)
        assert (stream.prompt_tokens, stream.completion_tokens, stream.finished) == (18, 8, True)

    def test_tool_calls_split_over_chunks_stream_as_tool_use_blocks(self) -> None:
        body, _ = streamed(chunks.TOOLS)
        message = checked_message_stream(body)
        assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
        first, second = message.content[1], message.content[2]
        assert first.type == "tool_use" and second.type == "tool_use"
        assert (first.id, first.name, first.input) == ("call_a", "get_weather", {"city": "Paris"})
        assert (second.id, second.name, second.input) == ("call_b", "get_time", {"zone": "CET"})
        assert message.stop_reason == "tool_use"
        deltas = [d["delta"] for n, d in sse_events(body) if n == "content_block_delta" and d["index"] == 1]
        assert [d["partial_json"] for d in deltas] == ['{"ci', 'ty": "Par', 'is"}']

    def test_a_tool_call_whose_name_comes_after_its_id_waits_for_it(self) -> None:
        events = [
            chunk({"role": "assistant", "tool_calls": [chunks.call(0, id="call_x")]}),
            chunk({"tool_calls": [chunks.call(0, name="f")]}),
            chunk({"tool_calls": [chunks.call(0, arguments='{"a": 1}')]}),
            chunk(finish="tool_calls"),
            DONE,
        ]
        message = checked_message_stream(streamed(events)[0])
        [block] = message.content
        assert block.type == "tool_use" and (block.id, block.name, block.input) == ("call_x", "f", {"a": 1})

    def test_a_tool_call_whose_name_never_comes_still_reaches_the_client(self) -> None:
        events = [
            chunk({"tool_calls": [chunks.call(0, id="call_x", arguments='{"a": 1}')]}),
            chunk(finish="tool_calls"),
            DONE,
        ]
        message = checked_message_stream(streamed(events)[0])
        [block] = message.content
        assert block.type == "tool_use" and (block.id, block.name, block.input) == ("call_x", "", {"a": 1})
        assert message.stop_reason == "tool_use"

    def test_reasoning_streams_as_a_thinking_block(self) -> None:
        message = checked_message_stream(streamed(chunks.REASONING)[0])
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].type == "thinking" and message.content[0].thinking == "The user greets me."

    def test_reasoning_named_as_vllm_names_it_streams_as_a_thinking_block_too(self) -> None:
        events = [
            chunk({"role": "assistant", "reasoning": "Hmm."}),
            chunk({"content": "Hi"}),
            chunk(finish="stop"),
            DONE,
        ]
        message = checked_message_stream(streamed(events)[0])
        assert message.content[0].type == "thinking" and message.content[0].thinking == "Hmm."

    def test_a_stream_ending_without_done_after_its_finish_ends_the_message(self) -> None:
        body, stream = streamed(chunks.TEXT[:-1])
        assert sse_events(body)[-1][0] == "message_stop"
        assert checked_message_stream(body).usage.output_tokens == 8
        assert stream.finished

    def test_a_stream_cut_before_its_finish_ends_in_an_error_event(self) -> None:
        body, stream = streamed(chunks.TEXT[:3])
        name, data = sse_events(body)[-1]
        assert name == "error"
        assert data == {
            "type": "error",
            "error": {
                "type": "api_error",
                "message": "the engine's stream ended before the reply was complete",
            },
        }
        error = anthropic_stream_error(body)
        assert "ended before the reply was complete" in str(error)
        assert stream.completion_tokens is None

    def test_an_engines_error_event_mid_stream_is_an_error_event(self) -> None:
        failure = json.dumps({"error": {"message": "KV cache is full", "code": 500}}).encode()
        body, stream = streamed([*chunks.TEXT[:2], failure, chunk({"content": "late"})])
        events = sse_events(body)
        assert events[-1] == (
            "error",
            {
                "type": "error",
                "error": {"type": "api_error", "message": "the engine failed mid-stream: KV cache is full"},
            },
        )
        assert stream.finished

    def test_the_gateways_own_error_event_ends_the_stream(self) -> None:
        stream = MessagesStream("tiny")
        body = stream.feed(chunks.TEXT[0]) + stream.error_event("the engine stalled", "overloaded_error")
        assert stream.feed(chunks.TEXT[1]) == b"" and stream.finish() == b""
        assert sse_events(body)[-1][1]["error"] == {
            "type": "overloaded_error",
            "message": "the engine stalled",
        }
        assert anthropic_stream_error(body).body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "the engine stalled"},
        }

    def test_a_stop_sequence_named_by_the_engine_ends_the_stream_with_it(self) -> None:
        events = [chunk({"content": "Hi"}), chunk(finish="stop", stop_reason="END"), usage(3, 1), DONE]
        message = checked_message_stream(streamed(events, stop_sequences=("END",))[0])
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")

    def test_a_cut_at_max_tokens_streams_its_stop_reason(self) -> None:
        events = [chunk({"content": "Hi"}), chunk(finish="length"), usage(3, 1), DONE]
        assert checked_message_stream(streamed(events)[0]).stop_reason == "max_tokens"

    def test_an_engine_counting_in_every_chunk_has_the_prompt_said_in_message_start(self) -> None:
        first = json.loads(chunks.TEXT[1])
        first["usage"] = {"prompt_tokens": 18, "completion_tokens": 1, "total_tokens": 19}
        body, _ = streamed([json.dumps(first).encode(), *chunks.TEXT[2:]])
        assert sse_events(body)[0][1]["message"]["usage"]["input_tokens"] == 18

    def test_chunks_given_as_objects_read_as_their_bytes_do(self) -> None:
        stream = MessagesStream("tiny")
        body = b"".join(stream.feed(e if e == DONE else json.loads(e)) for e in chunks.TEXT)
        assert checked_message_stream(body).content[0].type == "text"


class TestOddInput:
    @pytest.mark.parametrize("value", [0, "64", 2.5, False])
    def test_a_max_tokens_that_is_not_a_positive_whole_number_is_refused(self, value: object) -> None:
        with pytest.raises(
            TranslationError, match="max_tokens: must be a whole number of at least 1"
        ) as caught:
            request_to_chat({"model": "m", "max_tokens": value, "messages": []})
        assert caught.value.param == "max_tokens"

    @pytest.mark.parametrize("value", [1, "END", [1]])
    def test_stop_sequences_that_are_not_a_list_of_strings_are_refused(self, value: object) -> None:
        with pytest.raises(TranslationError, match="stop_sequences: must be a list of strings"):
            request_to_chat({"model": "m", "max_tokens": 1, "messages": [], "stop_sequences": value})

    def test_tool_arguments_an_engine_sends_as_an_object_are_the_input(self) -> None:
        calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]
        message = checked_message(reply_from_chat(completion({"tool_calls": calls}, "tool_calls"), "tiny"))
        assert message.content[0].type == "tool_use" and message.content[0].input == {"a": 1}


def test_a_claude_code_turn_translates_with_only_what_the_model_reads() -> None:
    """Shaped as Claude Code 2.1 sends a turn: cache_control everywhere, its billing line, thinking,
    context management and an effort the engines do not take, tools of its own."""
    cache = {"type": "ephemeral"}
    body = {
        "model": "tiny",
        "max_tokens": 32000,
        "stream": True,
        "metadata": {"user_id": "user_abc_account__session_1"},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "xhigh"},
        "system": [
            {
                "type": "text",
                "text": "x-anthropic-billing-header: cc_version=2.1.197.e51; cc_entrypoint=cli; cch=a5145;",
            },
            {"type": "text", "text": "You are Claude Code.", "cache_control": cache},
            {"type": "text", "text": "Use the tools.", "cache_control": cache},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>Today is Monday.</system-reminder>"},
                    {"type": "text", "text": "say hi", "cache_control": cache},
                ],
            }
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "Runs a command",
                "input_schema": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                    "additionalProperties": False,
                    "$schema": "http://json-schema.org/draft-07/schema#",
                },
                "cache_control": cache,
            }
        ],
    }
    chat = request_to_chat(body)
    assert chat == {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "You are Claude Code.\n\nUse the tools."},
            {"role": "user", "content": "<system-reminder>Today is Monday.</system-reminder>say hi"},
        ],
        "max_tokens": 32000,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "parameters": body["tools"][0]["input_schema"],
                    "description": "Runs a command",
                },
            }
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
