"""The APIs the sim engine speaks besides OpenAI's chat, completions and embeddings.

Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), OpenAI's
Responses API (/v1/responses), rerank (/v1/rerank, /rerank, and vLLM's
/v1/score) and transcriptions (/v1/audio/transcriptions), each in its own
shape, as llama-server and vLLM answer them natively, so that dev mode and
the tests serve every route the gateway has. Like the chat route, a reply
echoes the last user turn's tokens, at most the request's limit of them
(`max_tokens`, `max_output_tokens`; 16 when a Responses request names none).

- Messages: the reply is one text block; with `tool_choice` naming a tool
  (`{"type": "tool", "name": ...}`) or `{"type": "any"}` (the first tool), it
  is one `tool_use` block of that tool with the least input its schema takes
  (see minimal_value) and stop reason `tool_use`. `usage.input_tokens` counts
  the text of `system` and of every turn (text blocks and tool results); a
  stream is `message_start` (with the input tokens), one `content_block_delta`
  per token, `message_delta` (with the output tokens) and `message_stop`.
- Responses: `input` is a string or a list of items (messages, with text
  parts, and function call outputs); `instructions` counts too. A stream is
  `response.created`, `response.output_item.added`,
  `response.content_part.added`, one `response.output_text.delta` per token,
  the `.done` events and `response.completed` with the usage. With
  `tool_choice` naming a function (`{"type": "function", "name": ...}`) or
  `"required"` (the first function), the output is one `function_call` item
  of that function with the least arguments its schema takes and no output
  tokens; its stream is `response.output_item.added`, one
  `response.function_call_arguments.delta`, its `.done`,
  `response.output_item.done` and `response.completed`.
- Rerank: each document's `relevance_score` is the share of the query's
  tokens it holds; results best first, `top_n` of them; `usage` counts the
  query's tokens once per document plus the documents'.
- Transcriptions: the text says how many bytes of audio the file had;
  `usage` is the audio's duration, its bytes at 32,000 a second (16 kHz
  16-bit mono), as `{"type": "duration", "seconds": ...}`.

These are pure functions of the request; sim_server.py serves and paces them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from llmgw import strictjson
from llmgw.engines.sim_text import BadRequest, escaped, requested_max, tokens

# 16 kHz, 16-bit, mono: a second of the audio speech engines take.
AUDIO_BYTES_PER_S = 32000


def anthropic_error(error: BadRequest) -> web.Response:
    """A refusal in Anthropic's error shape, as the Messages routes answer."""
    kind = {401: "authentication_error", 404: "not_found_error"}.get(error.status, "invalid_request_error")
    if error.status >= 500:
        kind = "api_error"
    body = {"type": "error", "error": {"type": kind, "message": error.message}}
    return web.Response(status=error.status, body=strictjson.dumps(body), content_type="application/json")


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {strictjson.dumps(data, separators=(',', ':'))}\n\n"


def _block_text(block: Any) -> str:
    """The text a Messages content block or Responses item part holds, tool results included."""
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind in ("text", "input_text", "output_text"):
        text = block.get("text")
        return text if isinstance(text, str) else ""
    if kind == "tool_result":
        return _content_text(block.get("content"))
    if kind == "function_call_output":
        output = block.get("output")
        return output if isinstance(output, str) else ""
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(t for t in (_block_text(b) for b in content) if t)
    return ""


def minimal_value(schema: Any) -> Any:
    """The least value a JSON schema takes: only required properties, empty strings, zeros, minItems.

    Enough for a client's own validation of a forced call's arguments to pass; a
    schema this does not understand gets None (or {} at the top, via the caller).
    """
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return minimal_value(options[0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        return {name: minimal_value(properties.get(name)) for name in names}
    if kind == "array":
        return [minimal_value(schema.get("items")) for _ in range(_small(schema.get("minItems"), 16))]
    if kind == "string":
        return "x" * _small(schema.get("minLength"), 64)
    if kind in ("integer", "number"):
        least = schema.get("minimum")
        return least if isinstance(least, int | float) and not isinstance(least, bool) and least > 0 else 0
    if kind == "boolean":
        return False
    return None


def _small(bound: Any, top: int) -> int:
    """A schema's lower bound on a count, when it is one up to top (a sim makes no huge values), else 0."""
    return bound if isinstance(bound, int) and not isinstance(bound, bool) and 0 < bound <= top else 0


def _arguments(tool: dict[str, Any], schema_key: str) -> dict[str, Any]:
    value = minimal_value(tool.get(schema_key))
    return value if isinstance(value, dict) else {}


class Turns:
    """What a Messages or Responses request asks: its prompt's tokens, the reply's, and how it ends.

    `tool` is the tool a forced call names ("" for none) and `arguments` its input.
    """

    __slots__ = ("arguments", "prompt_tokens", "reply", "stream", "tool", "truncated")

    def __init__(
        self,
        texts: list[str],
        limit: int,
        body: dict[str, Any],
        tool: tuple[str, dict[str, Any]] = ("", {}),
    ) -> None:
        counted = [tokens(t) for t in texts]
        self.prompt_tokens = sum(len(c) for c in counted)
        last = counted[-1] if counted else []
        self.tool, self.arguments = tool
        self.reply = [] if self.tool else last[:limit]
        self.truncated = not self.tool and len(last) > limit
        self.stream = body.get("stream") is True


def _forced_tool(
    body: dict[str, Any], *, named: str, first: str, schema_key: str
) -> tuple[str, dict[str, Any]]:
    """The tool a request makes the model call and its least arguments, or ("", {}).

    `named` is the tool_choice type that names a tool ("tool" for Messages,
    "function" for Responses); `first` the choice that forces the first tool
    ("any" or "required", as a type or, for Responses, the whole choice).
    """
    choice = body.get("tool_choice")
    listed = body.get("tools")
    tools = [t for t in listed if isinstance(t, dict)] if isinstance(listed, list) else []
    if schema_key == "parameters":
        # Responses lists built-in tools beside functions; only a function is called here.
        tools = [t for t in tools if t.get("type") == "function"]
    if not tools:
        return "", {}
    kind = choice if isinstance(choice, str) else choice.get("type") if isinstance(choice, dict) else None
    if kind == named and isinstance(choice, dict) and isinstance(choice.get("name"), str):
        name = str(choice["name"])
        tool = next((t for t in tools if t.get("name") == name), {})
        return name, _arguments(tool, schema_key)
    if kind == first and isinstance(tools[0].get("name"), str):
        return str(tools[0]["name"]), _arguments(tools[0], schema_key)
    return "", {}


def forced_chat_tool(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The function a chat completions request forces a call of, as _forced_tool reads Responses'.

    Chat nests each tool's name and parameters under "function", in its tools and in
    a tool_choice naming one; Responses has them at the top.
    """
    listed = body.get("tools")
    tools = [
        {"type": "function", **t["function"]}
        for t in (listed if isinstance(listed, list) else [])
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
    ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        choice = {"type": choice.get("type"), "name": choice["function"].get("name")}
    flat = {"tools": tools, "tool_choice": choice}
    return _forced_tool(flat, named="function", first="required", schema_key="parameters")


def parse_messages(body: dict[str, Any], *, counting: bool = False) -> Turns:
    """A Messages API request (counting: a token count, which needs no max_tokens)."""
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        raise BadRequest(400, "messages: a non-empty list of turns is required", param="messages")
    if not counting and body.get("max_tokens") is None:
        raise BadRequest(400, "max_tokens: Field required", param="max_tokens")
    texts = [_content_text(body.get("system"))] if body.get("system") else []
    texts += [_content_text(turn.get("content")) for turn in turns]
    limit = 1 if counting else requested_max(body, ("max_tokens",))
    return Turns(texts, limit, body, _forced_tool(body, named="tool", first="any", schema_key="input_schema"))


def _message_head(ids: Iterator[int], model: str) -> dict[str, Any]:
    return {"id": f"msg_sim_{next(ids)}", "type": "message", "role": "assistant", "model": model}


def _stop_reason(turns: Turns) -> str:
    return "tool_use" if turns.tool else "max_tokens" if turns.truncated else "end_turn"


def message_reply(turns: Turns, ids: Iterator[int], model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = (
        [{"type": "tool_use", "id": f"toolu_sim_{next(ids)}", "name": turns.tool, "input": turns.arguments}]
        if turns.tool
        else [{"type": "text", "text": "".join(turns.reply)}]
    )
    return {
        **_message_head(ids, model),
        "content": content,
        "stop_reason": _stop_reason(turns),
        "stop_sequence": None,
        "usage": {"input_tokens": turns.prompt_tokens, "output_tokens": len(turns.reply)},
    }


def message_events(turns: Turns, ids: Iterator[int], model: str) -> Iterator[str]:
    """The stream: the events before the first token with it, one event per further token, then the end."""
    start = {
        **_message_head(ids, model),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": turns.prompt_tokens, "output_tokens": 0},
    }
    pending = _event("message_start", {"type": "message_start", "message": start})
    if turns.tool:
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": f"toolu_sim_{next(ids)}",
            "name": turns.tool,
            "input": {},
        }
        pending += _event(
            "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
        )
        delta = {"type": "input_json_delta", "partial_json": strictjson.dumps(turns.arguments)}
        pending += _event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    else:
        block = {"type": "text", "text": ""}
        pending += _event(
            "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
        )
        for word in escaped(turns.reply):
            yield (
                pending + 'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                f'"delta":{{"type":"text_delta","text":"{word}"}}}}\n\n'
            )
            pending = ""
    end = {"stop_reason": _stop_reason(turns), "stop_sequence": None}
    yield (
        pending
        + _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        + _event(
            "message_delta",
            {"type": "message_delta", "delta": end, "usage": {"output_tokens": len(turns.reply)}},
        )
        + _event("message_stop", {"type": "message_stop"})
    )


def parse_responses(body: dict[str, Any]) -> Turns:
    """A Responses API request: `input` a string or a list of items, `instructions` too."""
    given = body.get("input")
    if isinstance(given, str):
        texts = [given]
    elif isinstance(given, list) and given:
        texts = []
        for item in given:
            if not isinstance(item, dict):
                raise BadRequest(400, "input: every item must be an object", param="input")
            texts.append(_content_text(item.get("content")) if "content" in item else _block_text(item))
    else:
        raise BadRequest(400, "input must be a string or a non-empty list of items", param="input")
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        texts.insert(0, instructions)
    forced = _forced_tool(body, named="function", first="required", schema_key="parameters")
    return Turns(texts, requested_max(body, ("max_output_tokens",)), body, forced)


def _response(
    turns: Turns, response_id: str, item_id: str, model: str, created: int, *, done: bool
) -> dict[str, Any]:
    item = _output_item(turns, item_id, done=True)
    completion = len(turns.reply)
    usage = {
        "input_tokens": turns.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": turns.prompt_tokens + completion,
    }
    status = ("incomplete" if turns.truncated else "completed") if done else "in_progress"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if done and turns.truncated else None,
        "instructions": None,
        "model": model,
        "output": [item] if done else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage if done else None,
    }


def _output_item(turns: Turns, item_id: str, *, done: bool) -> dict[str, Any]:
    """The one output item: a message with the reply's text, or the forced function call."""
    status = "completed" if done else "in_progress"
    if turns.tool:
        return {
            "type": "function_call",
            "id": item_id,
            # One id for the item and the call, as the call's output names it back.
            "call_id": item_id.replace("fc_", "call_", 1),
            "name": turns.tool,
            "arguments": strictjson.dumps(turns.arguments) if done else "",
            "status": status,
        }
    content = [{"type": "output_text", "text": "".join(turns.reply), "annotations": []}] if done else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _item_id(turns: Turns, ids: Iterator[int]) -> str:
    return f"fc_sim_{next(ids)}" if turns.tool else f"msg_sim_{next(ids)}"


def response_reply(turns: Turns, ids: Iterator[int], model: str) -> dict[str, Any]:
    response_id = f"resp_sim_{next(ids)}"
    return _response(turns, response_id, _item_id(turns, ids), model, int(time.time()), done=True)


def response_events(turns: Turns, ids: Iterator[int], model: str) -> Iterator[str]:
    """The stream, as message_events cuts it: the first token with what precedes it, then one per token."""
    response_id = f"resp_sim_{next(ids)}"
    item_id, created = _item_id(turns, ids), int(time.time())
    sequence = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> str:
        return _event(kind, {"type": kind, "sequence_number": next(sequence), **data})

    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    pending = event(
        "response.created", response=_response(turns, response_id, item_id, model, created, done=False)
    )
    pending += event(
        "response.output_item.added", output_index=0, item=_output_item(turns, item_id, done=False)
    )
    whole = _response(turns, response_id, item_id, model, created, done=True)
    item = whole["output"][0]
    if turns.tool:
        # The arguments in one delta: they are no tokens of the reply, so nothing paces them.
        call = {"item_id": item_id, "output_index": 0}
        yield (
            pending
            + event("response.function_call_arguments.delta", **call, delta=item["arguments"])
            + event("response.function_call_arguments.done", **call, arguments=item["arguments"])
            + event("response.output_item.done", output_index=0, item=item)
            + event("response.completed", response=whole)
        )
        return
    pending += event(
        "response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []}
    )
    for word in escaped(turns.reply):
        yield (
            pending + 'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            f'"sequence_number":{next(sequence)},"item_id":"{item_id}","output_index":0,"content_index":0,'
            f'"delta":"{word}"}}\n\n'
        )
        pending = ""
    text = item["content"][0]["text"]
    yield (
        pending
        + event("response.output_text.done", **where, text=text)
        + event("response.content_part.done", **where, part=item["content"][0])
        + event("response.output_item.done", output_index=0, item=item)
        + event("response.completed", response=whole)
    )


def _documents(body: dict[str, Any]) -> list[str]:
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents:
        raise BadRequest(400, "documents must be a non-empty list", param="documents")
    texts = []
    for document in documents:
        text = (
            document
            if isinstance(document, str)
            else _block_text({"type": "text", **document})
            if isinstance(document, dict)
            else None
        )
        if not isinstance(text, str):
            raise BadRequest(400, "every document must be a string or an object with text", param="documents")
        texts.append(text)
    return texts


def _relevance(query: list[str], document: str) -> float:
    """The share of the query's tokens the document holds."""
    if not query:
        return 0.0
    held = {t.strip().lower() for t in tokens(document)}
    return sum(t.strip().lower() in held for t in query) / len(query)


def rerank_reply(body: dict[str, Any], ids: Iterator[int], model: str) -> dict[str, Any]:
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise BadRequest(400, "query must be a non-empty string", param="query")
    documents = _documents(body)
    asked = tokens(query)
    # Best first; ties in the documents' order.
    ranked = sorted((-_relevance(asked, d), i) for i, d in enumerate(documents))
    results: list[dict[str, Any]] = [{"index": i, "relevance_score": -score} for score, i in ranked]
    top_n = body.get("top_n")
    if isinstance(top_n, int) and not isinstance(top_n, bool) and top_n > 0:
        results = results[:top_n]
    if body.get("return_documents") is True:
        for result in results:
            result["document"] = {"text": documents[int(result["index"])]}
    count = len(asked) * len(documents) + sum(len(tokens(d)) for d in documents)
    return {
        "id": f"rerank-sim-{next(ids)}",
        "model": model,
        "results": results,
        "usage": {"prompt_tokens": count, "total_tokens": count},
    }


def score_reply(body: dict[str, Any], ids: Iterator[int], model: str) -> dict[str, Any]:
    """vLLM's /v1/score: text_1 against text_2 (one text or a list), a score each."""
    first, second = body.get("text_1"), body.get("text_2")
    seconds = [second] if isinstance(second, str) else second
    if (
        not isinstance(first, str)
        or not isinstance(seconds, list)
        or not all(isinstance(s, str) for s in seconds)
    ):
        raise BadRequest(
            400, "text_1 must be a string and text_2 a string or a list of strings", param="text_1"
        )
    asked = tokens(first)
    data = [{"index": i, "object": "score", "score": _relevance(asked, s)} for i, s in enumerate(seconds)]
    count = len(asked) * len(seconds) + sum(len(tokens(s)) for s in seconds)
    return {
        "id": f"score-sim-{next(ids)}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": count, "total_tokens": count},
    }


def transcription_reply(audio: bytes, response_format: str) -> tuple[str, str]:
    """(the reply's body, its content type) for an upload of audio bytes."""
    seconds = round(len(audio) / AUDIO_BYTES_PER_S, 3)
    text = f"sim heard {len(audio)} bytes of audio"
    if response_format == "text":
        return text + "\n", "text/plain"
    if response_format not in ("json", "verbose_json"):
        raise BadRequest(
            400,
            f"response_format {response_format!r} is not one the sim writes (json, verbose_json, text)",
            param="response_format",
        )
    reply: dict[str, Any] = {"text": text, "usage": {"type": "duration", "seconds": seconds}}
    if response_format == "verbose_json":
        reply = {"task": "transcribe", "language": "english", "duration": seconds, **reply, "segments": []}
    return strictjson.dumps(reply), "application/json"
