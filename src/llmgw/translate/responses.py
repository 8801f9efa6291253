"""OpenAI's Responses API said in chat completions' terms, for an engine that does not speak it.

`request_to_chat` turns a `POST /v1/responses` body into a chat completions body; `reply_from_chat`
turns the engine's chat completion into a `response` object; `ResponsesStream` turns the engine's
chat chunks into the Responses stream's typed events (`response.created` … `response.completed`),
each with its `type` and `sequence_number`.

A translated engine keeps no responses: `previous_response_id`, `conversation`, `store: true` and
`background` are refused in words, and the client sends the whole conversation in `input` (as
Codex and the Agents SDK do with `store: false`). What has no chat equivalent and changes what the
model sees (a file, a built-in tool such as web search) is refused too; what only tunes OpenAI's
own service (`include`, `truncation`, `service_tier`, `prompt_cache_key`) is dropped.

Tools chat has no word for are said as function tools: a `namespace` tool's tools each as a
function named `{namespace}__{name}`, a `custom` (freeform) tool as a function taking its text in
one string, `input`; the model's calls come back as the items the client gave the tools as
(`function_call` with its `namespace`, `custom_tool_call`). A built-in tool (web search, file
search…) runs on OpenAI's side and no engine can run it: it is left out, as llama-server's own
Responses route leaves it, so a client that offers one (Codex offers web search) still runs.
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

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
    new_id,
    object_at,
    positive,
    read_event,
    reasoning_of,
    text_of,
    tool_call_pieces,
    without_thinking,
)

# The request's fields chat takes under the same name.
_PASSED = ("temperature", "top_p", "parallel_tool_calls", "user", "chat_template_kwargs")

# The reasoning efforts chat completions take everywhere: vLLM refuses a request with another
# (`minimal`, `xhigh`), where the Responses API takes it; those are left to the engine's default.
_EFFORTS = ("low", "medium", "high")

# Why each refused field cannot be served by a translated engine.
_KEEPS_NOTHING = (
    "this model's engine does not speak the Responses API and keeps no responses; "
    "send the whole conversation in `input` (with `store: false`)"
)
_REFUSED = {
    "previous_response_id": _KEEPS_NOTHING,
    "conversation": _KEEPS_NOTHING,
    "prompt": "this model's engine cannot read OpenAI's stored prompt templates; send the prompt in `input`",
}


def request_to_chat(payload: JsonObject) -> JsonObject:
    """A Responses request as a chat completions request; TranslationError for what chat cannot say."""
    for field, why in _REFUSED.items():
        if payload.get(field):
            raise TranslationError(f"{field}: {why}", field)
    if payload.get("store") is True:
        raise TranslationError(f"store: {_KEEPS_NOTHING}", "store")
    if payload.get("background"):
        raise TranslationError(
            "background: this model's engine answers only while the client waits", "background"
        )
    chat: JsonObject = {"model": payload.get("model"), "messages": _messages(payload)}
    if payload.get("max_output_tokens") is not None:
        chat["max_tokens"] = positive(payload["max_output_tokens"], "max_output_tokens")
    for key in _PASSED:
        if payload.get(key) is not None:
            chat[key] = payload[key]
    tools = payload.get("tools")
    if tools:
        chat["tools"] = [_chat_tool(tool) for tool in _tool_table(_listed(tools, "tools")).values()]
    if payload.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(payload["tool_choice"])
    response_format = _response_format(payload.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    reasoning = payload.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") in _EFFORTS:
        chat["reasoning_effort"] = reasoning["effort"]
    elif isinstance(reasoning, dict) and reasoning.get("effort") == "none":
        without_thinking(chat)
    if payload.get("stream"):
        chat["stream"] = True
        # response.completed's usage needs the engine's, which it sends only when asked.
        chat["stream_options"] = {"include_usage": True}
    return chat


def reply_from_chat(chat: JsonObject, model: str, *, request: JsonObject | None = None) -> JsonObject:
    """A chat completion as a `response`, named for model; request's settings are echoed as OpenAI does."""
    choice = first_choice(chat)
    message = object_at(choice, "message")
    output: list[JsonObject] = []
    reasoning = reasoning_of(message)
    if reasoning:
        output.append(_reasoning_item(new_id("rs"), reasoning, "completed"))
    text = text_of(message.get("content"))
    if text:
        output.append(_message_item(new_id("msg"), text, "completed"))
    tools = _calls_of(request or {})
    for call in tool_call_pieces(message):
        item = _call_item(new_id("fc"), call.id or new_id("call"), tools.get(call.name), call.name, "")
        output.append(_call_done(item, call.arguments))
    usage = ChatUsage()
    usage.read(chat.get("usage"))
    response = _response(new_id("resp"), model, request or {}, int(time.time()))
    response.update(_ending(choice.get("finish_reason")), output=output, usage=_usage(usage))
    return response


def _ending(finish_reason: object) -> JsonObject:
    """The response's status for a chat finish_reason: cut at the token limit or by a filter is incomplete."""
    if finish_reason == "length":
        return {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    if finish_reason == "content_filter":
        return {"status": "incomplete", "incomplete_details": {"reason": "content_filter"}}
    return {"status": "completed", "incomplete_details": None}


def _usage(usage: ChatUsage) -> JsonObject | None:
    """Chat's counts in Responses' terms; None (the API's "not known") where the engine said none,
    rather than a count of 0 a client would take for a free reply."""
    if usage.prompt_tokens is None and usage.completion_tokens is None:
        return None
    prompt, completion = usage.prompt_tokens or 0, usage.completion_tokens or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": prompt + completion,
    }


def _response(response_id: str, model: str, request: JsonObject, created: int) -> JsonObject:
    """A response's fields that do not depend on the output: the request's settings, as OpenAI echoes them."""
    text = request.get("text") if isinstance(request.get("text"), dict) else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning"),
        "store": False,
        "temperature": request.get("temperature"),
        "text": text or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def _message_item(item_id: str, text: str, status: str) -> JsonObject:
    content = [_text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _text_part(text: str) -> JsonObject:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(item_id: str, call_id: str, tool: _Tool | None, chat_name: str, status: str) -> JsonObject:
    """A call item, as the client gave its tool: a function's (with its namespace) or a custom tool's.

    A name the request offered no tool by (the model's invention) is a function call by that name,
    so the client sees what the model said."""
    if tool is None:
        tool = _Tool("function", chat_name, None, {})
    item: JsonObject = {"id": item_id, "call_id": call_id, "name": tool.name}
    if tool.namespace is not None:
        item["namespace"] = tool.namespace
    if tool.kind == "custom":
        return {"type": "custom_tool_call", **item, "input": "", "status": status}
    return {"type": "function_call", **item, "arguments": "", "status": status}


def _call_done(item: JsonObject, arguments: str) -> JsonObject:
    """The call item whole, with the model's arguments: a custom tool's as the text it takes."""
    if item["type"] == "custom_tool_call":
        return {**item, "input": _custom_input(arguments), "status": "completed"}
    return {**item, "arguments": arguments, "status": "completed"}


def _custom_input(arguments: str) -> str:
    """A custom tool's text from the function call it was said as: its `input`, or the arguments as
    they came when the model did not write that object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    text = value.get("input") if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments


def _reasoning_item(item_id: str, text: str, status: str) -> JsonObject:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def _listed(value: object, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise TranslationError(f"{param}: must be a list", param)
    return value


def _messages(payload: JsonObject) -> list[JsonObject]:
    """The chat messages: instructions first, then input's items in order."""
    out: list[JsonObject] = []
    instructions = payload.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            raise TranslationError("instructions: must be a string", "instructions")
        out.append({"role": "system", "content": instructions})
    items = payload.get("input")
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return out
    # Past reasoning waits for the assistant message it came before.
    reasoning: list[str] = []
    for i, item in enumerate(_listed(items, "input")):
        if not isinstance(item, dict):
            raise TranslationError(f"input.{i}: each input item must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, i))
        elif kind in ("function_call", "custom_tool_call"):
            _add_call(out, item)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append(_call_output(item, i))
        elif kind == "reasoning":
            reasoning.extend(_reasoning_texts(item))
            continue
        else:
            raise TranslationError(
                f"input.{i}: this model's engine does not speak the Responses API, and a {kind!r} item "
                "has no equivalent in the chat completions it is translated to",
                "input",
            )
        if reasoning and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"] = "".join(reasoning)
            reasoning = []
    return _one_system_prompt(out)


def _one_system_prompt(messages: list[JsonObject]) -> list[JsonObject]:
    """The instructions and the developer messages after them as one system message: many models'
    templates refuse a second system message at the start (Qwen's: "System message must be at the
    beginning"), and Codex sends its instructions, then a developer message or two."""
    leading = 0
    while leading < len(messages) and messages[leading]["role"] == "system":
        leading += 1
    if leading < 2:
        return messages
    system = "\n\n".join(str(m["content"]) for m in messages[:leading])
    return [{"role": "system", "content": system}, *messages[leading:]]


def _message(item: JsonObject, i: int) -> JsonObject:
    """A message item: its role (developer is the system prompt to a chat template) and its content."""
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise TranslationError(
            f"input.{i}.role: must be user, assistant, system or developer, not {role!r}", "input"
        )
    content = item.get("content")
    role = "system" if role == "developer" else role
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = [
        _part(part, f"input.{i}.content.{j}") for j, part in enumerate(_listed(content, f"input.{i}.content"))
    ]
    if role != "user" or all(part["type"] == "text" for part in parts):
        if any(part["type"] != "text" for part in parts):
            raise TranslationError(f"input.{i}.content: only a user's message may hold images", "input")
        return {"role": role, "content": "".join(part["text"] for part in parts)}
    return {"role": role, "content": parts}


def _part(part: object, where: str) -> JsonObject:
    """A content part: text of any kind as text, an image as chat's image_url part."""
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(part, dict):
        raise TranslationError(f"{where}: a content part must be an object with a type", "input")
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": str(part.get("text") or "")}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal") or "")}
    if kind == "input_image":
        url = part.get("image_url")
        if not url:
            raise TranslationError(
                f"{where}: an image must be given by its image_url (a URL or a data: URL); "
                "files uploaded to OpenAI do not reach this model",
                "input",
            )
        image: JsonObject = {"url": url}
        if part.get("detail") in ("low", "high"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise TranslationError(
        f"{where}: this model's engine does not speak the Responses API, and a {kind!r} part has no "
        "equivalent in the chat completions it is translated to",
        "input",
    )


def _add_call(out: list[JsonObject], item: JsonObject) -> None:
    """A call item joins the assistant message before it, as chat holds a turn's calls together; it
    is said as request_to_chat said its tool (a custom tool's text as the `input` of a function)."""
    name = _chat_name(item.get("namespace"), str(item.get("name") or ""))
    if item.get("type") == "custom_tool_call":
        arguments = strictjson.dumps({"input": str(item.get("input") or "")}, ensure_ascii=False)
    else:
        arguments = str(item.get("arguments") or "")
    call = {
        "id": str(item.get("call_id") or ""),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    if not out or out[-1]["role"] != "assistant":
        out.append({"role": "assistant", "content": ""})
    out[-1].setdefault("tool_calls", []).append(call)


def _call_output(item: JsonObject, i: int) -> JsonObject:
    output = item.get("output")
    if isinstance(output, list):
        parts = [_part(part, f"input.{i}.output.{j}") for j, part in enumerate(output)]
        if any(part["type"] != "text" for part in parts):
            return {"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": parts}
        output = "".join(part["text"] for part in parts)
    if output is not None and not isinstance(output, str):
        # A client that sends its tool's result as an object rather than as its JSON.
        output = strictjson.dumps(output)
    return {"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": output or ""}


def _reasoning_texts(item: JsonObject) -> list[str]:
    """A reasoning item's text, or its summary's; an encrypted one (OpenAI's own) has none an engine reads."""
    for key in ("content", "summary"):
        parts = item.get(key)
        texts = (
            [str(p.get("text") or "") for p in parts if isinstance(p, dict)]
            if isinstance(parts, list)
            else []
        )
        if texts:
            return texts
    return []


class _Tool(NamedTuple):
    """A tool the client offered, as the model sees it by its chat name: a function or a custom tool,
    in a namespace or not; spec is the client's declaration of it."""

    kind: str
    name: str
    namespace: str | None
    spec: JsonObject


# What joins a namespace and its tool's name into the one name a chat function has: a function's
# name may hold letters, digits, `_` and `-` (OpenAI's rule, which templates are written for).
_NAMESPACE_JOIN = "__"

# The chat function a custom tool is said as: its text in one string.
_CUSTOM_PARAMETERS: JsonObject = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's whole input, as text."}},
    "required": ["input"],
    "additionalProperties": False,
}


def _chat_name(namespace: object, name: str) -> str:
    return f"{namespace}{_NAMESPACE_JOIN}{name}" if namespace else name


def _calls_of(request: JsonObject) -> dict[str, _Tool]:
    """The request's tools by the chat name the model calls them by; none if it offered none."""
    tools = request.get("tools")
    return _tool_table(tools) if isinstance(tools, list) and tools else {}


def _tool_table(tools: list[Any]) -> dict[str, _Tool]:
    """Each function and custom tool by its chat name, namespaces' tools flattened into the list;
    built-in tools, which run on OpenAI's side, are left out. TranslationError for a tool that is not
    one, or two whose chat names are the same (the model's call would not say which it meant)."""
    table: dict[str, _Tool] = {}

    def add(tool: object, where: str, namespace: str | None) -> None:
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise TranslationError(f"{where}: a tool must be an object with a type", "tools")
        kind = tool["type"]
        if kind == "namespace" and namespace is None:
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise TranslationError(f"{where}.name: a namespace needs a name", "tools")
            for j, inner in enumerate(_listed(tool.get("tools"), f"{where}.tools")):
                add(inner, f"{where}.tools.{j}", name)
            return
        if kind not in ("function", "custom"):
            if namespace is not None:
                raise TranslationError(
                    f"{where}: a namespace holds function and custom tools, not a {kind!r} tool", "tools"
                )
            return
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise TranslationError(f"{where}.name: a {kind} tool needs a name", "tools")
        chat_name = _chat_name(namespace, name)
        if chat_name in table:
            raise TranslationError(
                f"{where}: this model's engine does not speak the Responses API, and its tools are "
                f"named {chat_name!r} in the chat completions it is translated to, as another tool is",
                "tools",
            )
        table[chat_name] = _Tool(kind, name, namespace, tool)

    for i, tool in enumerate(tools):
        add(tool, f"tools.{i}", None)
    return table


def _chat_tool(tool: _Tool) -> JsonObject:
    """A tool as chat's function: a function's schema nested under `function`, a custom tool as a
    function taking its text as `input` (its grammar, if it has one, told in its description)."""
    spec = tool.spec
    function: JsonObject = {"name": _chat_name(tool.namespace, tool.name)}
    description = spec.get("description")
    if tool.kind == "custom":
        function["parameters"] = _CUSTOM_PARAMETERS
        fmt = spec.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "grammar" and fmt.get("definition"):
            grammar = f"The input follows this {fmt.get('syntax') or ''} grammar:\n{fmt['definition']}"
            description = f"{description}\n\n{grammar}" if description else grammar
    else:
        function["parameters"] = spec.get("parameters") or {"type": "object"}
        if spec.get("strict") is not None:
            function["strict"] = spec["strict"]
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> object:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise TranslationError(
        "tool_choice: a translated engine takes auto, none, required or a function by name", "tool_choice"
    )


def _response_format(text: object) -> JsonObject | None:
    """text.format as chat's response_format: a JSON schema (its fields flat in Responses, nested in chat)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        # OpenAI's chat completions require a name, which the Responses API does not.
        schema = {
            "name": "output",
            **{k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt},
        }
        return {"type": "json_schema", "json_schema": schema}
    raise TranslationError(
        f"text.format: the type must be text, json_object or json_schema, not {fmt['type']!r}", "text"
    )


class ResponsesStream(ChatStreamReader):
    """Turns an engine's chat chunks into the Responses stream's typed events, one event's data at a time.

    `feed` takes each chat event's data (`[DONE]` included) and returns the bytes to send; `finish`
    closes a stream the engine ended without `[DONE]`; `error_event` is `response.failed` for a
    stream cut by a failure. `prompt_tokens` and `completion_tokens` are what the engine counted.
    """

    def __init__(self, model: str, *, request: JsonObject | None = None) -> None:
        super().__init__()
        self.id = new_id("resp")
        self._response = _response(self.id, model, request or {}, int(time.time()))
        self._tools = _calls_of(request or {})
        self._sequence = 0
        self._started = False
        # Each output item: its JSON as it will be when done, and the text or arguments gathered so far.
        self._items: list[JsonObject] = []
        self._open: int | None = None
        self._calls = ToolCalls()
        # A chat tool call's index -> its output index.
        self._call_items: dict[int, int] = {}
        self._finish_reason: str | None = None

    def feed(self, data: bytes | str | JsonObject) -> bytes:
        """The Responses events one chat event's data makes; `[DONE]` ends the response."""
        if self._done:
            return b""
        try:
            chunk = read_event(data)
        except UpstreamError as e:
            return self.error_event(str(e))
        out = self._start()
        if chunk is None:
            return out + self._end()
        self._usage.read(chunk.get("usage"))
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return out
        choice = choices[0]
        delta = object_at(choice, "delta")
        reasoning = reasoning_of(delta)
        if reasoning:
            out += self._into("reasoning") + self._text_delta("response.reasoning_text.delta", reasoning)
        text = delta.get("content")
        if isinstance(text, str) and text:
            out += self._into("message") + self._text_delta("response.output_text.delta", text)
        for piece in tool_call_pieces(delta):
            out += self._call_events(self._calls.take(piece))
        if choice.get("finish_reason"):
            self._finish_reason = str(choice["finish_reason"])
        return out

    def finish(self) -> bytes:
        """The end of a stream the engine closed without `[DONE]`: complete if the engine said why it
        finished, failed if it did not."""
        if self._done:
            return b""
        if self._finish_reason is None:
            return self._start() + self.error_event("the engine's stream ended before the reply was complete")
        return self._start() + self._end()

    def error_event(self, message: str, code: str = "server_error") -> bytes:
        """`response.failed`, with what was output so far and the error; it ends the stream."""
        out = self._start()
        self._done = True
        response = {
            **self._response,
            "status": "failed",
            "output": self._output(),
            "usage": _usage(self._usage),
        }
        response["error"] = {"code": code, "message": message}
        return out + self._event("response.failed", {"response": response})

    def _output(self) -> list[JsonObject]:
        return [item for item in self._items if item["status"] == "completed"]

    def _event(self, kind: str, fields: JsonObject) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {strictjson.dumps(data, separators=(',', ':'))}\n\n".encode()

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._event("response.created", {"response": self._response}) + self._event(
            "response.in_progress", {"response": self._response}
        )

    def _end(self) -> bytes:
        self._done = True
        out = self._close()
        # Calls whose name never came still end up items: the client sees what came.
        late = self._calls.finish()
        if late:
            out += self._call_events(late) + self._close()
        ending = _ending(self._finish_reason)
        response = {**self._response, **ending, "output": self._output(), "usage": _usage(self._usage)}
        kind = "response.completed" if ending["status"] == "completed" else "response.incomplete"
        return out + self._event(kind, {"response": response})

    def _into(self, kind: str) -> bytes:
        """Opens an output item of kind (message or reasoning) unless it is the open one."""
        if self._open is not None and self._items[self._open]["type"] == kind:
            return b""
        out = self._close()
        item_id = new_id("msg" if kind == "message" else "rs")
        item = (
            _message_item(item_id, "", "in_progress")
            if kind == "message"
            else _reasoning_item(item_id, "", "in_progress")
        )
        out += self._add(item)
        if kind == "message":
            part = {
                "item_id": item_id,
                "output_index": self._open,
                "content_index": 0,
                "part": _text_part(""),
            }
            out += self._event("response.content_part.added", part)
        return out

    def _add(self, item: JsonObject) -> bytes:
        self._open = len(self._items)
        self._items.append({**item, "_text": ""})
        return self._event("response.output_item.added", {"output_index": self._open, "item": item})

    def _text_delta(self, kind: str, text: str) -> bytes:
        assert self._open is not None
        item = self._items[self._open]
        item["_text"] += text
        fields: JsonObject = {
            "item_id": item["id"],
            "output_index": self._open,
            "content_index": 0,
            "delta": text,
        }
        if kind == "response.output_text.delta":
            fields["logprobs"] = []
        return self._event(kind, fields)

    def _close(self) -> bytes:
        """Ends the open item: its text's done events, then output_item.done with the item whole."""
        if self._open is None:
            return b""
        index, self._open = self._open, None
        item = self._items[index]
        text = item.pop("_text")
        where = {"item_id": item["id"], "output_index": index}
        out = b""
        if item["type"] == "message":
            out += self._event(
                "response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []}
            )
            out += self._event(
                "response.content_part.done", {**where, "content_index": 0, "part": _text_part(text)}
            )
            item.update(_message_item(item["id"], text, "completed"))
        elif item["type"] == "reasoning":
            out += self._event("response.reasoning_text.done", {**where, "content_index": 0, "text": text})
            item.update(_reasoning_item(item["id"], text, "completed"))
        elif item["type"] == "custom_tool_call":
            # The text is the `input` of the JSON the model wrote, whole only at its end: one delta says it.
            done = _call_done(item, text)
            if done["input"]:
                out += self._event("response.custom_tool_call_input.delta", {**where, "delta": done["input"]})
            out += self._event("response.custom_tool_call_input.done", {**where, "input": done["input"]})
            item.update(done)
        else:
            out += self._event("response.function_call_arguments.done", {**where, "arguments": text})
            item.update(_call_done(item, text))
        return out + self._event("response.output_item.done", {"output_index": index, "item": item})

    def _call_events(self, events: list[CallStarted | CallArguments]) -> bytes:
        """A call's start adds its function_call item; its arguments are the item's argument deltas."""
        out = b""
        for event in events:
            if isinstance(event, CallStarted):
                out += self._close()
                tool = self._tools.get(event.name)
                out += self._add(
                    _call_item(new_id("fc"), event.id or new_id("call"), tool, event.name, "in_progress")
                )
                assert self._open is not None
                self._call_items[event.index] = self._open
                continue
            index = self._call_items[event.index]
            item = self._items[index]
            # A piece of a call already done has nowhere to go: engines send calls one after another.
            if "_text" not in item:
                continue
            item["_text"] += event.text
            if item["type"] == "function_call":
                delta = {"item_id": item["id"], "output_index": index, "delta": event.text}
                out += self._event("response.function_call_arguments.delta", delta)
        return out
