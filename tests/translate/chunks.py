"""Chat chunk sequences as engines stream them, the translations' input in the stream tests.

Shaped as llama-server b11434 and vLLM send them: a first chunk with the role, content or tool
call pieces, a chunk with the finish_reason, then (asked for with stream_options.include_usage)
one with no choices and the usage, then `[DONE]`.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"[DONE]"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    """One chunk's data, as the bytes after `data: `."""
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish, **extra}
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "tiny",
        "choices": [choice],
    }
    return json.dumps(body).encode()


def usage(prompt: int, completion: int, cached: int = 0) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "tiny",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    if cached:
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return json.dumps(body).encode()


def call(index: int, *, id: str = "", name: str = "", arguments: str = "") -> dict[str, Any]:
    """A tool call delta's piece: the first carries id and name, the rest pieces of the arguments."""
    piece: dict[str, Any] = {"index": index, "function": {}}
    if id:
        piece["id"] = id
        piece["type"] = "function"
    if name:
        piece["function"]["name"] = name
    if arguments or not name:
        piece["function"]["arguments"] = arguments
    return piece


# A plain answer: "Hi there." in three pieces.
TEXT = [
    chunk({"role": "assistant", "content": None}),
    chunk({"content": "Hi"}),
    chunk({"content": " there"}),
    chunk({"content": "."}),
    chunk(finish="stop"),
    usage(18, 8),
    DONE,
]

# Some words, then two tool calls whose arguments (and, for the first, its JSON's keys) are split over chunks.
TOOLS = [
    chunk({"role": "assistant", "content": "Let me look."}),
    chunk({"tool_calls": [call(0, id="call_a", name="get_weather", arguments="")]}),
    chunk({"tool_calls": [call(0, arguments='{"ci')]}),
    chunk({"tool_calls": [call(0, arguments='ty": "Par')]}),
    chunk({"tool_calls": [call(0, arguments='is"}')]}),
    chunk({"tool_calls": [call(1, id="call_b", name="get_time", arguments='{"zone": ')]}),
    chunk({"tool_calls": [call(1, arguments='"CET"}')]}),
    chunk(finish="tool_calls"),
    usage(40, 21),
    DONE,
]

# A reasoning model: its thinking (llama-server's reasoning_content), then the answer.
REASONING = [
    chunk({"role": "assistant", "reasoning_content": "The user"}),
    chunk({"reasoning_content": " greets me."}),
    chunk({"content": "Hello!"}),
    chunk(finish="stop"),
    usage(10, 6),
    DONE,
]
