"""The sim engine's words: how it counts tokens, what a request asks of it, how it refuses.

Shared by the OpenAI routes (sim_server.py) and the other APIs it speaks (sim_apis.py).
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from llmgw import strictjson

DEFAULT_MAX_TOKENS = 16

# A run of ASCII that is not whitespace, or one character outside ASCII: the gateway's prompt
# reservation must hold for prompts a byte-count-over-four estimate undercounts (one-letter words,
# CJK, emoji), so the sim counts them the way a real tokenizer roughly does.
# Each match keeps the whitespace before it, so that the echo puts a space only where the prompt had one.
_TOKEN = re.compile(r"\s*(?:[^\s\x80-\U0010ffff]+|\S)")


def tokens(text: str) -> list[str]:
    """The text's tokens, each with one space before it where the text had whitespace (none first)."""
    pieces = [" " + t.lstrip() if t[0].isspace() else t for t in _TOKEN.findall(text)]
    if pieces:
        pieces[0] = pieces[0].lstrip()
    return pieces


class BadRequest(Exception):
    """A request the sim refuses, with OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def dead() -> BadRequest:
    """What a dead serving loop answers, in vLLM's words for it."""
    return BadRequest(500, "EngineCore encountered an issue; the engine is dead (the sim was sent SIGUSR1)")


def error_response(error: BadRequest) -> web.Response:
    kind = "invalid_request_error" if error.status < 500 else "server_error"
    body = {"error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}}
    return web.Response(status=error.status, body=strictjson.dumps(body), content_type="application/json")


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def escaped(words: list[str]) -> list[str]:
    """Each word escaped for the inside of a JSON string, with one json.dumps for all of them.

    Inside a JSON string every quote is escaped, so '", "' can only be the separator json.dumps
    puts between list items.
    """
    if not words:
        return []
    return strictjson.dumps(words)[2:-2].split('", "')


def requested_max(body: dict[str, Any], names: tuple[str, ...]) -> int:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(400, f"{name} must be a positive whole number, not {value!r}", param=name)
        return value
    return DEFAULT_MAX_TOKENS


class Request:
    """What one completion request asks for, parsed once."""

    __slots__ = ("arguments", "include_usage", "prompt_tokens", "reply", "stream", "tool", "truncated")

    def __init__(
        self,
        prompt_tokens: int,
        prompt_words: list[str],
        max_tokens: int,
        body: dict[str, Any],
        tool: tuple[str, dict[str, Any]] = ("", {}),
    ):
        # tool: the function a chat request forces a call of ("" for none) and its arguments.
        self.tool, self.arguments = tool
        self.prompt_tokens = prompt_tokens
        self.reply = [] if self.tool else prompt_words[:max_tokens]
        self.truncated = not self.tool and len(prompt_words) > max_tokens
        self.stream = body.get("stream") is True
        options = body.get("stream_options")
        self.include_usage = (
            self.stream and isinstance(options, dict) and options.get("include_usage") is True
        )

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool else "length" if self.truncated else "stop"

    def usage(self) -> dict[str, int]:
        completion = len(self.reply)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
