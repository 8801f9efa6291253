"""What both translations read of chat completions: the refusal, a stream's events, its tool calls, its usage.

The Messages and Responses translations turn a request into a chat completions request, and the
engine's chat reply or chat chunks back into their own API's shape. What they share is here: how a
chunk's data is read, how a tool call's pieces, split over chunks, are put back together, and what
the engine said it used.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import attrs

from llmgw import strictjson

# A chat stream's last event: `data: [DONE]`.
DONE = "[DONE]"

JsonObject = dict[str, Any]


class TranslationError(Exception):
    """A request that cannot be said in chat completions' terms: the gateway answers it with a 400.

    The message is for the person who wrote the request ("content block 2 of message 1 is a
    `document`, which ..."); param names the field, as OpenAI's and Anthropic's errors do.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UpstreamError(Exception):
    """The engine's stream said something other than a chat chunk: an error event, or not JSON."""


def positive(value: object, param: str) -> int:
    """A token limit: a whole number of at least 1, or a TranslationError naming param."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TranslationError(
            f"{param}: must be a whole number of at least 1, not {strictjson.dumps(value)}", param
        )
    return value


def without_thinking(chat: JsonObject) -> None:
    """Asks the engine's template not to think: `enable_thinking: false` in chat_template_kwargs,
    which the hybrid models' templates (Qwen3, DeepSeek, GLM) read on llama-server, vLLM and SGLang,
    and the others ignore. A client's own chat_template_kwargs win."""
    kwargs = chat.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    kwargs.setdefault("enable_thinking", False)
    chat["chat_template_kwargs"] = kwargs


def new_id(prefix: str) -> str:
    """An identifier in the style of the API it belongs to: `msg_…`, `resp_…`, `toolu_…`."""
    return f"{prefix}_{secrets.token_hex(12)}"


def read_event(data: bytes | str | JsonObject) -> JsonObject | None:
    """A chat stream event's data as a chunk; None for `[DONE]`; UpstreamError for anything else.

    An engine that fails mid-stream sends `data: {"error": {...}}` (llama-server, vLLM); that is
    the engine's failure told in its words, not a chunk.
    """
    if isinstance(data, dict):
        chunk = data
    else:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        text = text.strip()
        if text == DONE:
            return None
        try:
            chunk = json.loads(text)
        except ValueError:
            raise UpstreamError(f"the engine sent an event that is not JSON: {text[:120]!r}") from None
    if not isinstance(chunk, dict):
        raise UpstreamError("the engine sent an event that is not a JSON object")
    error = chunk.get("error")
    if error is not None:
        said = error.get("message") if isinstance(error, dict) else error
        raise UpstreamError(f"the engine failed mid-stream: {said}")
    return chunk


@attrs.define
class ChatUsage:
    """What the engine counted, in chat completions' terms; None where it has not said."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Of the prompt, the tokens the engine found in its prefix cache (prompt_tokens_details.cached_tokens).
    cached_tokens: int = 0
    # Of the completion, the tokens of the model's reasoning (completion_tokens_details.reasoning_tokens).
    reasoning_tokens: int = 0

    def read(self, usage: object) -> None:
        """Take a chat `usage` object's counts, where it gives them."""
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int):
            self.prompt_tokens = prompt
        if isinstance(completion, int):
            self.completion_tokens = completion
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(cached, int) and cached > 0:
            self.cached_tokens = min(cached, self.prompt_tokens or 0)
        details = usage.get("completion_tokens_details")
        reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
        if isinstance(reasoning, int) and reasoning > 0:
            self.reasoning_tokens = min(reasoning, self.completion_tokens or 0)


def reasoning_of(message: JsonObject) -> str:
    """The reasoning a chat message or delta carries: llama-server and SGLang say `reasoning_content`,
    vLLM's newer builds `reasoning`."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def matched_stop(choice: JsonObject, stops: list[str]) -> str | None:
    """The stop sequence that ended the choice, where the engine says which.

    vLLM names it in the choice's `stop_reason`, SGLang in `matched_stop`; llama-server does not say,
    and a reply that ended on a stop sequence then reads as an ordinary end of turn.
    """
    for key in ("stop_reason", "matched_stop"):
        value = choice.get(key)
        if isinstance(value, str) and value in stops:
            return value
    return None


def parse_arguments(arguments: str) -> JsonObject:
    """A tool call's arguments as the object both APIs carry.

    Arguments that are not a JSON object (a small model's broken JSON) are kept whole under
    `arguments` rather than dropped: the client's tool then says what is wrong with them, and the
    model sees it on the next turn, where an empty object would run the tool with nothing.
    """
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


class ChatStreamReader:
    """What each streamed translation keeps of the chat stream it reads: the usage the engine
    counted (None until it says; the gateway charges it) and whether its last event is said."""

    def __init__(self) -> None:
        self._usage = ChatUsage()
        self._done = False

    @property
    def prompt_tokens(self) -> int | None:
        return self._usage.prompt_tokens

    @property
    def completion_tokens(self) -> int | None:
        return self._usage.completion_tokens

    @property
    def finished(self) -> bool:
        """Whether the stream has said its last event (its end, or an error)."""
        return self._done


@attrs.define
class ToolCallPiece:
    """What one chunk's tool call delta added: the call's place, and the new parts of it."""

    index: int
    id: str
    name: str
    arguments: str


def tool_call_pieces(message: JsonObject) -> list[ToolCallPiece]:
    """The tool calls of a reply's message, or the fragments of them in a chunk's delta, in order."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    pieces = []
    for position, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        function = object_at(call, "function")
        index, arguments = call.get("index"), function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            # An engine that sends the arguments as an object rather than as their JSON.
            arguments = strictjson.dumps(arguments)
        pieces.append(
            ToolCallPiece(
                index=index if isinstance(index, int) else position,
                id=_text(call.get("id")),
                name=_text(function.get("name")),
                arguments=arguments or "",
            )
        )
    return pieces


@attrs.frozen
class CallStarted:
    """A tool call whose name has come: the client's block or item for it opens."""

    index: int
    id: str
    name: str


@attrs.frozen
class CallArguments:
    """More of a started tool call's arguments."""

    index: int
    text: str


class ToolCalls:
    """Puts a stream's tool calls back together from the pieces its chunks carry.

    A call starts once its name has come: most engines send the id and the name in the first
    piece, but one that sends the id first would otherwise open a block with no name, which a
    client cannot run. Arguments that came before the name follow the start. Engines send the
    calls one after another, so a call's pieces follow its start.
    """

    def __init__(self) -> None:
        self._started: set[int] = set()
        self._held: dict[int, ToolCallPiece] = {}

    @property
    def seen(self) -> bool:
        """Whether any piece of a call has come, started or not."""
        return bool(self._started or self._held)

    def take(self, piece: ToolCallPiece) -> list[CallStarted | CallArguments]:
        """What one piece adds: nothing yet, a call's start, or its arguments."""
        if piece.index in self._started:
            return [CallArguments(piece.index, piece.arguments)] if piece.arguments else []
        held = self._held.pop(piece.index, None)
        if held is not None:
            piece = ToolCallPiece(
                index=piece.index,
                id=held.id or piece.id,
                name=held.name + piece.name,
                arguments=held.arguments + piece.arguments,
            )
        if not piece.name:
            self._held[piece.index] = piece
            return []
        return self._start(piece)

    def finish(self) -> list[CallStarted | CallArguments]:
        """The calls whose name never came, started as they are: the client sees what the engine sent."""
        events: list[CallStarted | CallArguments] = []
        for index in sorted(self._held):
            events += self._start(self._held.pop(index))
        return events

    def _start(self, piece: ToolCallPiece) -> list[CallStarted | CallArguments]:
        self._started.add(piece.index)
        events: list[CallStarted | CallArguments] = [CallStarted(piece.index, piece.id, piece.name)]
        if piece.arguments:
            events.append(CallArguments(piece.index, piece.arguments))
        return events


def object_at(value: JsonObject, key: str) -> JsonObject:
    """value[key] when it is an object; an empty one when the engine sent something else or nothing."""
    found = value.get(key)
    return found if isinstance(found, dict) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def first_choice(chat: JsonObject) -> JsonObject:
    """The reply's one choice: the translations ask for one (no `n`); none is the engine's fault."""
    choices = chat.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    raise UpstreamError("the engine's reply has no choices")


def text_of(content: object) -> str:
    """A chat message's content as text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""
