"""The APIs the gateway serves, one declaration each: where it is, what it asks of a model, how it counts.

Every route goes the same way through the gateway (pipeline.py): its key,
limits, budgets, routing, fallbacks, timeouts and journal are the chat
route's. What differs between APIs is declared here and nowhere else:

- its paths, and the kind of model it is for (`kind` in the catalog);
- how its body is read (JSON, or a multipart form whose `model` is a field)
  and the most bytes it may have;
- which field bounds what it generates, the reservation (`max_tokens`,
  `max_output_tokens`; none for embeddings, rerank, token counts);
- how its reply and its stream report usage (`usage` in OpenAI's names or
  Anthropic's; the stream's last word on it), and which event ends a stream;
- the shape of its errors: Anthropic's on the Messages routes, OpenAI's on
  the others.

A new API is one more `Api` in `APIS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import attrs

from llmgw import strictjson
from llmgw.gateway import checks, prompts
from llmgw.gateway.errors import ApiError, ErrorShape

ModelKind = Literal["chat", "embeddings", "rerank", "transcription"]
# A stream's usage as it has reported it so far: (prompt tokens or None, completion tokens or None, and
# whether this is its last word on them).
StreamUsage = tuple[int | None, int | None, bool]

# OpenAI's limit on an audio upload, which its clients check before sending: a transcription's whole
# multipart body is held to it (the file and the form's other fields).
MAX_AUDIO_BODY = 25 * 1024 * 1024
# Whisper's encoder sees 50 frames of audio a second: what a transcription reported only by its audio's
# duration (`usage.type: duration`) is charged as prompt tokens.
AUDIO_TOKENS_PER_S = 50
# A transcription reserves one prompt token for this many bytes of its upload: no codec a speech
# engine takes (Opus at 6 kb/s is 750 bytes a second) packs a second of audio into fewer than 750
# bytes, so the reservation bounds AUDIO_TOKENS_PER_S of every second it can hold.
AUDIO_BYTES_PER_TOKEN = 15


@attrs.frozen
class StreamShape:
    """How an API's stream of server-sent events ends and reports what it cost."""

    # Where the stream's end begins: the gateway holds it back until the request's usage is journaled.
    end: bytes
    # What marks an event carrying generated text, counted when a stream breaks before reporting
    # usage; empty: every event counts.
    delta: bytes
    # Reads one event that mentions usage; None: OpenAI's `usage` object, found in the raw bytes.
    usage: Callable[[dict[str, Any]], StreamUsage] | None
    # The event that ends a stream the engine broke, in the API's own words.
    error_event: Callable[[ApiError], bytes]


@attrs.frozen
class Api:
    """One API the gateway serves."""

    name: str
    paths: tuple[str, ...]
    kind: ModelKind
    stream: StreamShape
    # Fields bounding the tokens a request generates, the first present wins; empty: it generates none.
    limit: tuple[str, ...] = ()
    # It generates text no field of the request bounds (a transcription): the model's max_tokens is
    # reserved for it.
    unbounded_text: bool = False
    # Whether `n`/`best_of` multiply what it generates (OpenAI's chat and text completions).
    choices: bool = False
    # Whether the gateway may ask for a stream's usage with `stream_options` (OpenAI's chat and text
    # completions: the other APIs always report it).
    stream_options: bool = False
    # False: a request that costs nothing (a token count); it still counts against rpm.
    metered: bool = True
    errors: ErrorShape = "openai"
    body: Literal["json", "multipart"] = "json"
    # Whether its replies are JSON (a transcription may be plain text, SRT or WebVTT, as asked).
    replies_json: bool = True
    # The most bytes its body may have; 0: the gateway's own limit.
    max_body: int = 0
    # Refuses a body that is not this API's own (checks.py), before anything is reserved.
    check: checks.Check | None = None
    # The most prompt tokens a JSON body can bring to the model (prompts.py).
    prompt_bound: Callable[[dict[str, Any]], int] = prompts.prompt_bound

    def reserved_prompt(self, payload: dict[str, Any], body_bytes: int) -> int:
        """The most prompt tokens the request can bring: its JSON's text (prompts.py), or for an upload a
        token per AUDIO_BYTES_PER_TOKEN bytes of it."""
        if self.body == "multipart":
            return body_bytes // AUDIO_BYTES_PER_TOKEN + prompts.TEMPLATE_OVERHEAD
        return min(self.prompt_bound(payload), prompts.MOST_PROMPT_TOKENS)


def _openai_error_event(error: ApiError) -> bytes:
    """OpenAI's chat streams end an error as one `data:` event of its error object."""
    return b"data: " + strictjson.dumps(error.body("openai")).encode() + b"\n\n"


def _anthropic_error_event(error: ApiError) -> bytes:
    """Anthropic's streams say an error as `event: error`, its data the error as a reply would have it."""
    return b"event: error\ndata: " + strictjson.dumps(error.body("anthropic")).encode() + b"\n\n"


def _responses_error_event(error: ApiError) -> bytes:
    """The Responses API's `error` event: its code and message at the top level."""
    data = {"type": "error", "code": error.code, "message": error.message, "param": None}
    return b"event: error\ndata: " + strictjson.dumps(data).encode() + b"\n\n"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def anthropic_prompt(usage: dict[str, Any]) -> int | None:
    """The prompt tokens of Anthropic's usage: its input, and what was written to or read from its cache."""
    prompt = _count(usage.get("input_tokens"))
    if prompt is None:
        return None
    cached = (_count(usage.get(name)) for name in ("cache_creation_input_tokens", "cache_read_input_tokens"))
    return prompt + sum(c for c in cached if c is not None)


def _messages_usage(event: dict[str, Any]) -> StreamUsage:
    """message_start has the input (and an output of 0 or 1 so far); message_delta the output, finally."""
    kind = event.get("type")
    if kind == "message_start":
        message = event.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
        if isinstance(usage, dict):
            return anthropic_prompt(usage), None, False
    elif kind == "message_delta":
        usage = event.get("usage")
        if isinstance(usage, dict):
            return anthropic_prompt(usage), _count(usage.get("output_tokens")), True
    return None, None, False


def _responses_usage(event: dict[str, Any]) -> StreamUsage:
    """The response's usage once it is over (response.completed, .incomplete or .failed)."""
    if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
        response = event.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if isinstance(usage, dict):
            return _count(usage.get("input_tokens")), _count(usage.get("output_tokens")), True
    return None, None, False


def reply_usage(value: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a `usage` object in any of the shapes the APIs report it in.

    OpenAI's prompt_tokens/completion_tokens; Anthropic's and the Responses API's
    input_tokens/output_tokens; an embeddings or rerank reply's prompt_tokens or total_tokens alone
    (nothing generated); a transcription's audio duration (`type: duration`, `seconds`), charged at
    AUDIO_TOKENS_PER_S.
    """
    prompt, completion = _count(value.get("prompt_tokens")), _count(value.get("completion_tokens"))
    if prompt is None and "input_tokens" in value:
        prompt, completion = anthropic_prompt(value), _count(value.get("output_tokens"))
        if prompt is not None and completion is None and "total_tokens" in value:
            completion = 0
    if prompt is None and completion is None:
        total = _count(value.get("total_tokens"))
        if total is not None:
            return total, 0
        seconds = value.get("seconds")
        if value.get("type") == "duration" and isinstance(seconds, int | float) and seconds >= 0:
            return math.ceil(seconds * AUDIO_TOKENS_PER_S), 0
        return None
    if prompt is not None and completion is None and "total_tokens" in value:
        # An embeddings reply: prompt and total tokens only, nothing generated.
        completion = 0
    if prompt is None or completion is None:
        return None
    return prompt, completion


_CHAT_STREAM = StreamShape(end=b"data: [DONE]", delta=b"", usage=None, error_event=_openai_error_event)
_MESSAGES_STREAM = StreamShape(
    end=b"event: message_stop",
    delta=b'"content_block_delta"',
    usage=_messages_usage,
    error_event=_anthropic_error_event,
)
_RESPONSES_STREAM = StreamShape(
    end=b"event: response.completed",
    delta=b'.delta"',
    usage=_responses_usage,
    error_event=_responses_error_event,
)
# An API that never streams: whatever arrives as events is read as OpenAI's.
_NO_STREAM = _CHAT_STREAM

CHAT = Api(
    "chat",
    ("/v1/chat/completions",),
    "chat",
    _CHAT_STREAM,
    limit=("max_completion_tokens", "max_tokens"),
    choices=True,
    stream_options=True,
)
COMPLETIONS = Api(
    "completions",
    ("/v1/completions",),
    "chat",
    _CHAT_STREAM,
    limit=("max_tokens",),
    choices=True,
    stream_options=True,
)
EMBEDDINGS = Api("embeddings", ("/v1/embeddings",), "embeddings", _NO_STREAM, check=checks.embeddings)
MESSAGES = Api(
    "messages",
    ("/v1/messages",),
    "chat",
    _MESSAGES_STREAM,
    limit=("max_tokens",),
    errors="anthropic",
    check=checks.messages,
)
COUNT_TOKENS = Api(
    "count_tokens",
    ("/v1/messages/count_tokens",),
    "chat",
    _NO_STREAM,
    metered=False,
    errors="anthropic",
    check=checks.count_tokens,
)
RESPONSES = Api(
    "responses",
    ("/v1/responses",),
    "chat",
    _RESPONSES_STREAM,
    limit=("max_output_tokens",),
)
RERANK = Api(
    "rerank",
    ("/v1/rerank", "/rerank", "/v1/score"),
    "rerank",
    _NO_STREAM,
    prompt_bound=prompts.rerank_bound,
)
TRANSCRIPTIONS = Api(
    "transcriptions",
    ("/v1/audio/transcriptions",),
    "transcription",
    _NO_STREAM,
    body="multipart",
    max_body=MAX_AUDIO_BODY,
    unbounded_text=True,
    replies_json=False,
)

APIS: tuple[Api, ...] = (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    COUNT_TOKENS,
    RESPONSES,
    RERANK,
    TRANSCRIPTIONS,
)


def served_paths() -> str:
    """The routes the gateway serves, in words (for a 404)."""
    return "/v1/models, " + ", ".join(path for api in APIS for path in api.paths)


def paths_for(kind: ModelKind) -> str:
    """The routes that serve a model of kind, in words."""
    paths = [path for api in APIS if api.kind == kind for path in api.paths]
    return ", ".join(paths[:-1]) + (" or " if len(paths) > 1 else "") + paths[-1]
