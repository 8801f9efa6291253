"""The most tokens a request's prompt can be, from the text that reaches the model.

Admission reserves this before anything is generated (admission.py), and an
engine's report of more prompt tokens is held to it, so it must never be below
the engine's count; it should not be far above it either, or a request that
fits a budget is refused. One token per byte of the request body was both
safe and loose: a prompt of 400 one-letter words (401 tokens) reserved 1,013,
and 400 CJK characters sent as `\\uXXXX` escapes, six bytes of JSON each,
reserved 3,013.

So the bound is counted on the decoded request: what a chat template can
show the model, in UTF-8 bytes, since every tokenizer the engines use (byte-
level BPE; SentencePiece with byte fallback) spends at least one byte of text
per token. Fields that only steer generation (`model`, `max_tokens`,
`temperature`, `stream`, ...) reach no prompt and cost nothing; a field the
gateway does not know costs its JSON, so that nothing new is ever free.

- A message's text (its content, the text of its parts, its tool calls and
  results, the system prompt, the instructions) costs its bytes as JSON
  would escape them: some templates write a tool's result with `tojson`
  (Llama 3.1), where each newline and quote is two bytes.
- Data a template writes as JSON (tool definitions, a response format, a
  tool call's `input`) costs its JSON with a line per value, and
  `LINE_TOKENS` a line for the indentation a template may give it
  (`tojson(indent=4)`: a run of spaces, one or two tokens).
- What the template adds costs a fixed allowance in tokens: for each turn,
  each part of a turn or each prompt of a list, for the tools' preamble and
  each tool, and `TEMPLATE_OVERHEAD` once (BOS, a default system prompt,
  the assistant's header). Special tokens are one token each, so the
  allowances are counts of them and of the few words around them.
- A token id (a completion's or an embedding's prompt given as ids) is one token.
- A rerank pairs its query with every document: the query counts once a document.
"""

from __future__ import annotations

from json.encoder import encode_basestring
from typing import Any

from llmgw import strictjson

# Added once to every prompt: BOS, a default system prompt (Qwen's "You are Qwen, created by Alibaba
# Cloud..."), the assistant's header that asks for the reply.
TEMPLATE_OVERHEAD = 128
# A turn's markers: `<|start_header_id|>user<|end_header_id|>\n\n…<|eot_id|>`, `<|im_start|>…<|im_end|>\n`,
# or plain text such as `<|user|>\n…</s>\n`; a prompt's BOS and EOS in a list of prompts.
TURN_TOKENS = 16
# A part of a turn (joined with "\n\n"), a tool call's scaffolding (`{"name": …, "arguments": …}`), a
# prompt of a list, a token-id prompt's BOS.
PART_TOKENS = 4
# The preamble a template gives a request that offers tools (Qwen's "# Tools\n\nYou may call one or
# more functions…" is about 90 tokens; Granite's and Llama 3.1's are shorter).
TOOLS_TOKENS = 256
# Each tool's framing, and the `{"type": "function", "function": …}` a Messages or Responses tool is
# wrapped in when translated to chat.
TOOL_TOKENS = 64
# A Responses `custom` tool said in chat: a fixed schema of its one text input and a sentence naming
# its grammar (translate/responses.py).
CUSTOM_TOOL_TOKENS = 256
# The indentation of one line of JSON a template writes with `tojson(indent=…)`.
LINE_TOKENS = 2
# The most any request reserves for its prompt, whatever its bound (a rerank's is its query times its
# documents): no engine takes a prompt of 64 Mi tokens (the longest contexts are some 10 million),
# and maxima.py reckons what a request can be charged on it (a token per byte of the largest body).
MOST_PROMPT_TOKENS = 64 * 1024 * 1024 + TEMPLATE_OVERHEAD

# Fields that steer generation or the gateway and never reach the prompt.
_STEERING = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "n",
        "best_of",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_sequences",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "metadata",
        "store",
        "service_tier",
        "parallel_tool_calls",
        "ignore_eos",
        "cache_prompt",
        "encoding_format",
        "dimensions",
        "top_n",
        "return_documents",
        "add_generation_prompt",
        "continue_final_message",
        "prompt_cache_key",
        "safety_identifier",
        "truncation",
        "include",
        "echo",
    }
)
_TURN_FIELDS = frozenset({"system", "instructions"})
_PROMPT_FIELDS = frozenset({"messages", "input", "prompt"})
_TOOL_FIELDS = frozenset({"tools", "functions"})


def prompt_bound(payload: dict[str, Any]) -> int:
    """The most prompt tokens a JSON request can bring to the model (the module says how it is counted)."""
    total = TEMPLATE_OVERHEAD
    for name, value in payload.items():
        if name in _STEERING:
            continue
        if name in _PROMPT_FIELDS:
            total += _prompts(value)
        elif name in _TURN_FIELDS:
            total += TURN_TOKENS + _text(value)
        elif name in _TOOL_FIELDS and isinstance(value, list):
            total += (TOOLS_TOKENS if value else 0) + sum(_tool(tool) for tool in value)
        else:
            total += _json(value)
    return total


def rerank_bound(payload: dict[str, Any]) -> int:
    """A rerank's bound: its query (`query`, `text_1`) goes to the model once with each document."""
    documents = payload.get("documents", payload.get("text_2"))
    query = payload.get("query", payload.get("text_1"))
    pairs = len(documents) if isinstance(documents, list) else 1
    again = (_text(query) + PART_TOKENS) * (pairs - 1) if isinstance(query, str) else 0
    return prompt_bound(payload) + again


def _prompts(value: object) -> int:
    """`messages`, `input` or `prompt`: turns, prompts, or token ids."""
    if isinstance(value, str):
        return TURN_TOKENS + _text(value)
    if not isinstance(value, list):
        return _json(value)
    if all(isinstance(v, int) for v in value):
        return len(value) + PART_TOKENS
    total = 0
    for item in value:
        if isinstance(item, dict):
            total += TURN_TOKENS + _text(item)
        elif isinstance(item, list) and all(isinstance(v, int) for v in item):
            total += len(item) + PART_TOKENS
        else:
            total += PART_TOKENS + _text(item)
    return total


def _text(value: object) -> int:
    """What a template can show of a turn's value: its strings (as JSON escapes them), not its keys."""
    if isinstance(value, str):
        return _escaped(value)
    if isinstance(value, list):
        return sum(_text(v) + PART_TOKENS for v in value)
    if isinstance(value, dict):
        total = 0
        for name, inner in value.items():
            if name == "input" and isinstance(inner, dict | list):
                # A Messages tool call's input: the translation writes it as the call's arguments with
                # Python's json, non-ASCII as \u escapes.
                total += PART_TOKENS + len(strictjson.dumps(inner))
            else:
                total += _text(inner)
        return total
    return _json(value)


def _tool(tool: object) -> int:
    """One tool: its definition as JSON, its framing; a namespace's tools each framed and named."""
    total = TOOL_TOKENS + _json(tool)
    if not isinstance(tool, dict):
        return total
    if tool.get("type") == "custom":
        total += CUSTOM_TOOL_TOKENS
    inner = tool.get("tools")
    if tool.get("type") == "namespace" and isinstance(inner, list):
        # Each of its tools is named `namespace__name` in chat: the namespace's name again, per tool.
        name = tool.get("name")
        named = _escaped(name) if isinstance(name, str) else 0
        total += sum(_tool(t) - _json(t) + named for t in inner)
    return total


def _escaped(text: str) -> int:
    """The UTF-8 bytes of text as a JSON string, non-ASCII kept (json's own C function: a long
    conversation has thousands of strings, and this runs on every request)."""
    return len(encode_basestring(text).encode())


def _json(value: object) -> int:
    """The bytes of value as a template's `tojson` writes it, each line's indentation as LINE_TOKENS."""
    written = strictjson.dumps(value, ensure_ascii=False, indent=0).encode()
    return len(written) + LINE_TOKENS * written.count(b"\n")
