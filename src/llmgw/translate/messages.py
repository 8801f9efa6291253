"""Anthropic's Messages API said in chat completions' terms, for an engine that does not speak it.

`request_to_chat` turns a `POST /v1/messages` body into a chat completions body; `reply_from_chat`
turns the engine's chat completion into a Messages reply; `MessagesStream` turns the engine's chat
chunks, one event at a time, into the Messages stream's events (`message_start`, the content
blocks, `message_delta`, `message_stop`). `count_tokens_request` and `count_tokens_reply` do the
same for `/v1/messages/count_tokens` through an engine's `/tokenize`.

What has no chat equivalent is refused with a TranslationError, never silently dropped, when it
changes what the model sees (a `document` block, a server tool); what only tunes Anthropic's own
service (`metadata`, `cache_control`, `thinking`'s budget) is dropped. Thinking: a `thinking` block
in the history goes to the assistant message's `reasoning_content`, which llama-server and vLLM
give to templates that show past reasoning; the engine's reasoning comes back as a `thinking`
block whose `signature` is empty, since no engine signs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmgw import strictjson
from llmgw.translate.chat import (
    CallArguments,
    CallStarted,
    ChatStreamReader,
    ChatUsage,
    JsonObject,
    ToolCalls,
    TranslationError,
    UpstreamError,
    first_choice,
    matched_stop,
    new_id,
    object_at,
    parse_arguments,
    positive,
    read_event,
    reasoning_of,
    text_of,
    tool_call_pieces,
    without_thinking,
)

# Chat's finish_reason as the Messages stop_reason. content_filter is the engine refusing to go on.
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}

# The request's fields chat takes as they are: sampling, and the template's own switches (llama-server,
# vLLM and SGLang take chat_template_kwargs, e.g. to turn a model's thinking off).
_PASSED = ("temperature", "top_p", "top_k", "chat_template_kwargs")


def request_to_chat(payload: JsonObject) -> JsonObject:
    """A Messages request as a chat completions request; TranslationError for what chat cannot say."""
    if "max_tokens" not in payload:
        raise TranslationError(
            "max_tokens: a Messages request must say how many tokens the reply may take", "max_tokens"
        )
    if payload.get("mcp_servers"):
        raise TranslationError("mcp_servers: this model's engine cannot reach MCP servers", "mcp_servers")
    chat: JsonObject = {"model": payload.get("model"), "messages": _messages(payload)}
    last = chat["messages"][-1] if chat["messages"] else {}
    if last.get("role") == "assistant" and "tool_calls" not in last:
        # A prefill: the reply goes on from the assistant's words. vLLM and SGLang start a new turn
        # unless told to continue (and refuse to both continue and add a generation prompt);
        # llama-server continues a final assistant message by itself and takes the flags.
        chat["continue_final_message"] = True
        chat["add_generation_prompt"] = False
    chat["max_tokens"] = positive(payload["max_tokens"], "max_tokens")
    for key in _PASSED:
        if key in payload:
            chat[key] = payload[key]
    stops = payload.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
            raise TranslationError("stop_sequences: must be a list of strings", "stop_sequences")
        chat["stop"] = stops
    tools = payload.get("tools")
    if tools:
        chat["tools"] = [_tool(tool, i) for i, tool in enumerate(_listed(tools, "tools"))]
    if payload.get("tool_choice") is not None:
        chat.update(_tool_choice(payload["tool_choice"]))
    chat.update(_output_config(payload.get("output_config")))
    thinking = payload.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        without_thinking(chat)
    if payload.get("stream"):
        chat["stream"] = True
        # The usage comes in the last chunk only when asked for: message_delta's output_tokens need it.
        chat["stream_options"] = {"include_usage": True}
    # Everything else (metadata, thinking's budget, service_tier, context_management, ...) tunes
    # Anthropic's own service and is dropped, as Anthropic's clients expect of a server older than they are.
    return chat


def count_tokens_request(payload: JsonObject) -> JsonObject:
    """A count_tokens body as the chat form of an engine's `/tokenize` (vLLM, SGLang): the messages and
    tools the prompt is made of, the template's generation prompt added as for a real request."""
    chat = request_to_chat({**payload, "max_tokens": 1, "stream": False})
    body: JsonObject = {"model": chat["model"], "messages": chat["messages"], "add_generation_prompt": True}
    for key in ("tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"):
        if key in chat:
            body[key] = chat[key]
    return body


def count_tokens_reply(tokenized: JsonObject) -> JsonObject:
    """A `/tokenize` reply (`count`, or the `tokens` themselves) as count_tokens' `{"input_tokens": n}`."""
    count = tokenized.get("count")
    if not isinstance(count, int):
        tokens = tokenized.get("tokens")
        if not isinstance(tokens, list):
            raise UpstreamError("the engine's /tokenize reply has neither `count` nor `tokens`")
        count = len(tokens)
    return {"input_tokens": count}


def reply_from_chat(chat: JsonObject, model: str, *, stop_sequences: Sequence[str] = ()) -> JsonObject:
    """A chat completion as a Messages reply, named for model (the name the client asked for).

    stop_sequences are the request's: a stop the engine names as one of them is the reply's
    `stop_sequence`.
    """
    choice = first_choice(chat)
    message = object_at(choice, "message")
    content: list[JsonObject] = []
    reasoning = reasoning_of(message)
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = text_of(message.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    calls = tool_call_pieces(message)
    for call in calls:
        content.append(
            {
                "type": "tool_use",
                "id": call.id or new_id("toolu"),
                "name": call.name,
                "input": parse_arguments(call.arguments),
            }
        )
    stop = matched_stop(choice, list(stop_sequences))
    usage = ChatUsage()
    usage.read(chat.get("usage"))
    return {
        "id": new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop_reason(choice.get("finish_reason"), stop, bool(calls)),
        "stop_sequence": stop,
        "usage": _usage(usage),
    }


def _stop_reason(finish_reason: object, stop: str | None, called: bool) -> str:
    """The Messages stop_reason of a chat finish_reason. A reply with tool calls stops for them, whatever
    the engine calls it (some say `stop`): the client runs the tools only on `tool_use`."""
    if stop is not None:
        return "stop_sequence"
    if called and finish_reason in (None, "stop", "tool_calls"):
        return "tool_use"
    return _STOP_REASONS.get(str(finish_reason), "end_turn")


def _usage(usage: ChatUsage) -> JsonObject:
    """Chat's counts in Messages' terms, where `input_tokens` leaves out what was read from the cache."""
    prompt = usage.prompt_tokens or 0
    shown: JsonObject = {
        "input_tokens": prompt - usage.cached_tokens,
        "output_tokens": usage.completion_tokens or 0,
    }
    if usage.cached_tokens:
        shown["cache_read_input_tokens"] = usage.cached_tokens
    return shown


def _listed(value: object, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise TranslationError(f"{param}: must be a list", param)
    return value


def _messages(payload: JsonObject) -> list[JsonObject]:
    """The chat messages: the system prompt first, then each turn, its tool results as `tool` messages."""
    out: list[JsonObject] = []
    system = _system_text(payload["system"]) if payload.get("system") else ""
    if system:
        out.append({"role": "system", "content": system})
    for i, message in enumerate(_listed(payload.get("messages"), "messages")):
        if not isinstance(message, dict):
            raise TranslationError(
                f"messages.{i}: each message must be an object with a role and content", "messages"
            )
        role = message.get("role")
        content = message.get("content")
        if role not in ("user", "assistant"):
            raise TranslationError(
                f"messages.{i}.role: must be `user` or `assistant`, not {role!r}", "messages"
            )
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif role == "assistant":
            out.extend(_assistant(content, i))
        else:
            out.extend(_user(content, i))
    return out


def _system_text(system: object) -> str:
    """The system prompt's text: a string, or its text blocks joined, less Claude Code's billing line."""
    if isinstance(system, str):
        return _without_billing_header(system)
    parts = []
    for j, block in enumerate(_listed(system, "system")):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise TranslationError(
                f"system.{j}: a system prompt holds text blocks only, not {kind!r}", "system"
            )
        text = _without_billing_header(str(block.get("text") or ""))
        if text:
            parts.append(text)
    return "\n\n".join(parts)


# Claude Code's first system block: "x-anthropic-billing-header: cc_version=…; cch=a5145;", a hash
# that changes with every request. Anthropic reads it for its billing; to an engine it is a
# different prompt prefix each turn, so its prefix cache never got past it and every turn of a
# 3,000-token prompt was computed again.
_BILLING_HEADER = "x-anthropic-billing-header:"


def _without_billing_header(text: str) -> str:
    if _BILLING_HEADER not in text:
        return text
    kept = [line for line in text.split("\n") if not line.startswith(_BILLING_HEADER)]
    return "\n".join(kept).strip("\n")


def _assistant(content: object, i: int) -> list[JsonObject]:
    """An assistant turn: its text, its tool calls, and its past reasoning."""
    texts: list[str] = []
    calls: list[JsonObject] = []
    reasoning: list[str] = []
    for j, block in enumerate(_listed(content, f"messages.{i}.content")):
        kind = _block_type(block, i, j)
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name") or ""),
                        "arguments": strictjson.dumps(block.get("input") or {}),
                    },
                }
            )
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking") or ""))
        elif kind == "redacted_thinking":
            # Anthropic's encrypted reasoning: no engine can read it.
            continue
        else:
            raise _unknown_block(kind, i, j, "an assistant turn")
    message: JsonObject = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return [message]


def _user(content: object, i: int) -> list[JsonObject]:
    """A user turn: its tool results first, as `tool` messages (chat wants them right after the call),
    then what the user said, text and images, as one user message."""
    tool_messages: list[JsonObject] = []
    parts: list[JsonObject] = []
    for j, block in enumerate(_listed(content, f"messages.{i}.content")):
        kind = _block_type(block, i, j)
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        elif kind == "image":
            parts.append(_image(block, f"messages.{i}.content.{j}"))
        elif kind == "tool_result":
            tool_messages.append(_tool_result(block, f"messages.{i}.content.{j}"))
        else:
            raise _unknown_block(kind, i, j, "a user turn")
    out = tool_messages
    if parts:
        only_text = all(part["type"] == "text" for part in parts)
        out.append({"role": "user", "content": "".join(p["text"] for p in parts) if only_text else parts})
    return out


def _tool_result(block: JsonObject, where: str) -> JsonObject:
    """A tool_result as a chat `tool` message: its text, or its text and images as parts."""
    result = block.get("content")
    message: JsonObject = {"role": "tool", "tool_call_id": str(block.get("tool_use_id") or "")}
    if result is None or isinstance(result, str):
        text = result or ""
        message["content"] = f"Error: {text}" if block.get("is_error") and text else text
        return message
    parts: list[JsonObject] = []
    for k, item in enumerate(_listed(result, f"{where}.content")):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(item.get("text") or "")})
        elif kind == "image":
            parts.append(_image(item, f"{where}.content.{k}"))
        else:
            raise TranslationError(
                f"{where}.content.{k}: a tool result holds text and images only, not {kind!r}", "messages"
            )
    if all(part["type"] == "text" for part in parts):
        text = "".join(part["text"] for part in parts)
        message["content"] = f"Error: {text}" if block.get("is_error") and text else text
    else:
        message["content"] = parts
    return message


def _image(block: JsonObject, where: str) -> JsonObject:
    """An image block as chat's image_url part: base64 as a data: URL, a URL as it is."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict):
        media = source.get("media_type") or "image/jpeg"
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{source.get('data') or ''}"}}
    if kind == "url" and isinstance(source, dict):
        return {"type": "image_url", "image_url": {"url": str(source.get("url") or "")}}
    raise TranslationError(
        f"{where}.source: an image must be given as base64 data or a URL, not {kind!r} "
        "(files uploaded to Anthropic do not reach this model)",
        "messages",
    )


def _block_type(block: object, i: int, j: int) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise TranslationError(
            f"messages.{i}.content.{j}: a content block must be an object with a type", "messages"
        )
    return str(block["type"])


def _unknown_block(kind: str, i: int, j: int, turn: str) -> TranslationError:
    return TranslationError(
        f"messages.{i}.content.{j}: this model's engine does not speak the Messages API, and a {kind!r} "
        f"block in {turn} has no equivalent in the chat completions it is translated to",
        "messages",
    )


def _tool(tool: object, i: int) -> JsonObject:
    """A client tool as a chat function; Anthropic's server tools (web search, code execution) run on
    Anthropic's side and are refused."""
    if not isinstance(tool, dict) or not tool.get("name"):
        raise TranslationError(f"tools.{i}: a tool must be an object with a name", "tools")
    kind = tool.get("type")
    if kind not in (None, "custom") or "input_schema" not in tool:
        raise TranslationError(
            f"tools.{i}: {tool['name']!r} ({kind}) is one of Anthropic's server tools, which this model's "
            "engine cannot run; give it as a tool with an input_schema",
            "tools",
        )
    function: JsonObject = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _output_config(config: object) -> JsonObject:
    """output_config's JSON schema as chat's response_format, and its effort where chat takes it.

    Chat completions take low, medium and high everywhere (vLLM refuses another); xhigh and max
    are left to the engine's default.
    """
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise TranslationError("output_config: must be an object", "output_config")
    out: JsonObject = {}
    fmt = config.get("format")
    if fmt is not None:
        if (
            not isinstance(fmt, dict)
            or fmt.get("type") != "json_schema"
            or not isinstance(fmt.get("schema"), dict)
        ):
            raise TranslationError(
                "output_config.format: must be a json_schema with its schema", "output_config"
            )
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt["schema"]},
        }
    if config.get("effort") in ("low", "medium", "high"):
        out["reasoning_effort"] = config["effort"]
    return out


def _tool_choice(choice: object) -> JsonObject:
    """Messages' tool_choice as chat's, with `disable_parallel_tool_use` as parallel_tool_calls."""
    if not isinstance(choice, dict):
        raise TranslationError("tool_choice: must be an object with a type", "tool_choice")
    kind = choice.get("type")
    out: JsonObject = {}
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool" and choice.get("name"):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise TranslationError(
            f"tool_choice: the type must be auto, any, tool (with a name) or none, not {kind!r}",
            "tool_choice",
        )
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


class MessagesStream(ChatStreamReader):
    """Turns an engine's chat chunks into the Messages stream, one event's data at a time.

    `feed` takes each chat event's data (`[DONE]` included) and returns the bytes to send, often
    none; `finish` closes a stream the engine ended without `[DONE]`; `error_event` is the event for
    a stream cut by a failure. `prompt_tokens` and `completion_tokens` are what the engine counted
    (None until it says): the gateway charges them.
    """

    def __init__(self, model: str, *, stop_sequences: Sequence[str] = ()) -> None:
        super().__init__()
        self.id = new_id("msg")
        self.model = model
        self._stops = list(stop_sequences)
        self._started = False
        # The open content block: its index and kind ("text", "thinking" or "tool").
        self._block: tuple[int, str] | None = None
        self._next_index = 0
        self._calls = ToolCalls()
        # A chat tool call's index -> its content block's index, once its block has started.
        self._tool_blocks: dict[int, int] = {}
        self._finish_reason: str | None = None
        self._stop: str | None = None

    def feed(self, data: bytes | str | JsonObject) -> bytes:
        """The Messages events one chat event's data makes; `[DONE]` ends the message."""
        if self._done:
            return b""
        try:
            chunk = read_event(data)
        except UpstreamError as e:
            return self.error_event(str(e))
        if chunk is not None:
            # Before message_start: an engine that counts in every chunk (vLLM's continuous usage
            # stats) gives the prompt's tokens from the first, and message_start can say them.
            self._usage.read(chunk.get("usage"))
        out = self._start()
        if chunk is None:
            return out + self._end()
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return out
        choice = choices[0]
        delta = object_at(choice, "delta")
        reasoning = reasoning_of(delta)
        if reasoning:
            out += self._into("thinking") + self._delta({"type": "thinking_delta", "thinking": reasoning})
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._into("text") + self._delta({"type": "text_delta", "text": text})
        for piece in tool_call_pieces(delta):
            out += self._tool_events(self._calls.take(piece))
        if choice.get("finish_reason"):
            self._finish_reason = str(choice["finish_reason"])
            self._stop = matched_stop(choice, self._stops)
        return out

    def finish(self) -> bytes:
        """The end of a stream the engine closed without `[DONE]`: the message ends if the engine said why
        it finished, and the client is told of a cut stream if it did not."""
        if self._done:
            return b""
        if self._finish_reason is None:
            return self._start() + self.error_event("the engine's stream ended before the reply was complete")
        return self._start() + self._end()

    def error_event(self, message: str, type: str = "api_error") -> bytes:
        """The event telling the client the stream was cut, in Anthropic's error shape; it ends the stream."""
        self._done = True
        return _event("error", {"type": "error", "error": {"type": type, "message": message}})

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: JsonObject = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._usage.prompt_tokens or 0, "output_tokens": 0},
        }
        return _event("message_start", {"type": "message_start", "message": message})

    def _end(self) -> bytes:
        self._done = True
        out = self._close()
        # Calls whose name never came still end up blocks: the client sees what came.
        late = self._calls.finish()
        if late:
            out += self._tool_events(late) + self._close()
        stop_reason = _stop_reason(self._finish_reason, self._stop, self._calls.seen)
        usage = _usage(self._usage)
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": self._stop}}
        out += _event("message_delta", {**delta, "usage": usage})
        return out + _event("message_stop", {"type": "message_stop"})

    def _into(self, kind: str) -> bytes:
        """Opens a block of kind unless it is the open one."""
        if self._block is not None and self._block[1] == kind:
            return b""
        out = self._close()
        index = self._next_index
        self._next_index += 1
        self._block = (index, kind)
        block: JsonObject = {"type": "text", "text": ""}
        if kind == "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
        return out + _event(
            "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
        )

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        index = self._block[0]
        self._block = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _delta(self, delta: JsonObject) -> bytes:
        assert self._block is not None
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": self._block[0], "delta": delta}
        )

    def _tool_events(self, events: list[CallStarted | CallArguments]) -> bytes:
        """A call's start opens its tool_use block; its arguments are the block's input_json_deltas."""
        out = b""
        for event in events:
            if isinstance(event, CallStarted):
                out += self._close()
                index = self._next_index
                self._next_index += 1
                self._block = (index, "tool")
                self._tool_blocks[event.index] = index
                block = {
                    "type": "tool_use",
                    "id": event.id or new_id("toolu"),
                    "name": event.name,
                    "input": {},
                }
                start = {"type": "content_block_start", "index": index, "content_block": block}
                out += _event("content_block_start", start)
            else:
                delta = {"type": "input_json_delta", "partial_json": event.text}
                data = {
                    "type": "content_block_delta",
                    "index": self._tool_blocks[event.index],
                    "delta": delta,
                }
                out += _event("content_block_delta", data)
        return out


def _event(name: str, data: JsonObject) -> bytes:
    return f"event: {name}\ndata: {strictjson.dumps(data, separators=(',', ':'))}\n\n".encode()
