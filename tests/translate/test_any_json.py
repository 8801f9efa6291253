"""Whatever JSON a client or an engine sends, a translation answers in words or translates: it never crashes.

The gateway turns a TranslationError into a 400 and an UpstreamError into the engine's failure;
any other exception would be a 500 with a traceback, for a body a client typed wrong.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.translate import TranslationError, UpstreamError, messages, responses

_SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def _block(kinds: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """A content block or item with a real type and fields of any shape: nearer misses than any JSON."""
    fields = st.sampled_from(
        [
            "text",
            "source",
            "input",
            "content",
            "id",
            "name",
            "tool_use_id",
            "is_error",
            "thinking",
            "image_url",
            "output",
            "call_id",
            "arguments",
            "role",
            "summary",
            "detail",
        ]
    )
    return st.builds(
        lambda kind, extra: {"type": kind, **extra},
        st.sampled_from(kinds),
        st.dictionaries(fields, _JSON, max_size=4),
    )


_MESSAGE_BLOCKS = _block(
    ["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking", "document"]
)
_RESPONSE_ITEMS = _block(
    ["message", "function_call", "function_call_output", "reasoning", "input_text", "input_image"]
)
_MESSAGES_BODY = st.fixed_dictionaries(
    {},
    optional={
        "model": _JSON,
        "max_tokens": _JSON,
        "system": _JSON | st.lists(_MESSAGE_BLOCKS, max_size=2),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "assistant", "system"]) | _JSON,
                    "content": _JSON | st.lists(_MESSAGE_BLOCKS, max_size=3),
                }
            ),
            max_size=3,
        ),
        "tools": _JSON
        | st.lists(
            st.dictionaries(st.sampled_from(["name", "type", "input_schema", "description"]), _JSON),
            max_size=2,
        ),
        "tool_choice": _JSON,
        "stop_sequences": _JSON,
        "stream": _JSON,
        "mcp_servers": _JSON,
    },
)
_RESPONSES_BODY = st.fixed_dictionaries(
    {},
    optional={
        "model": _JSON,
        "input": _JSON
        | st.lists(
            _RESPONSE_ITEMS
            | st.fixed_dictionaries(
                {"role": _JSON | st.just("user"), "content": _JSON | st.lists(_RESPONSE_ITEMS, max_size=2)}
            ),
            max_size=3,
        ),
        "instructions": _JSON,
        "tools": _JSON
        | st.lists(
            st.dictionaries(st.sampled_from(["name", "type", "parameters", "strict"]), _JSON), max_size=2
        ),
        "tool_choice": _JSON,
        "text": _JSON | st.fixed_dictionaries({"format": _JSON}),
        "reasoning": _JSON,
        "store": _JSON,
        "previous_response_id": _JSON,
        "max_output_tokens": _JSON,
        "stream": _JSON,
    },
)
_CHAT_REPLY = st.dictionaries(
    st.sampled_from(["choices", "usage", "id"]),
    _JSON
    | st.lists(
        st.dictionaries(
            st.sampled_from(["message", "finish_reason", "stop_reason", "delta", "index"]),
            _JSON
            | st.dictionaries(st.sampled_from(["content", "tool_calls", "reasoning_content", "role"]), _JSON),
        ),
        max_size=2,
    ),
)

_FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(_MESSAGES_BODY)
def test_any_messages_body_is_translated_or_refused_in_words(body: dict[str, Any]) -> None:
    try:
        messages.request_to_chat(body)
    except TranslationError as e:
        assert e.message


@_FUZZ
@given(_RESPONSES_BODY)
def test_any_responses_body_is_translated_or_refused_in_words(body: dict[str, Any]) -> None:
    try:
        responses.request_to_chat(body)
    except TranslationError as e:
        assert e.message


@_FUZZ
@given(_CHAT_REPLY)
def test_any_engine_reply_is_translated_or_called_the_engines_failure(reply: dict[str, Any]) -> None:
    for translate in (messages.reply_from_chat, responses.reply_from_chat):
        with contextlib.suppress(UpstreamError):
            translate(reply, "tiny")


@_FUZZ
@given(st.lists(_CHAT_REPLY | _JSON, max_size=4))
def test_any_engine_stream_is_translated_or_ended_with_an_error_event(events: list[Any]) -> None:
    for stream in (messages.MessagesStream("tiny"), responses.ResponsesStream("tiny")):
        for event in events:
            stream.feed(event if isinstance(event, dict) else str(event))
        stream.finish()
        assert stream.finished
