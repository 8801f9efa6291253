"""What the gateway checks of a request's body before it costs anything: that it is the API's own.

An engine refuses a body it cannot read, but in its own words and shape:
llama-server answers a chat body sent to /v1/messages with OpenAI's error
object, which Anthropic's clients cannot read, and takes a Messages body
without `max_tokens` as one that may run to the end of its context. So the
few rules every client of an API relies on are checked here, and broken ones
are refused in the API's shape before admission reserves anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmgw.gateway.errors import ApiError

# The content blocks of Anthropic's Messages API a request may carry (docs.anthropic.com, "Messages"),
# its server tools' results included: a client replays them in the history it sends back. A type
# outside it is no Messages block (OpenAI's `image_url`, `input_text`): a body meant for another API.
MESSAGE_BLOCKS = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "tool_reference",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    }
)
_ROLES = ("user", "assistant")

Check = Callable[[dict[str, Any]], None]


def _refuse(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_request")


def _blocks(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _refuse(f"{where}.content must be a string or a list of content blocks", where)
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise _refuse(f"{where}.content[{j}] must be a content block with a type", where)
        if kind not in MESSAGE_BLOCKS:
            known = ", ".join(sorted(MESSAGE_BLOCKS))
            raise _refuse(
                f"{where}.content[{j}] is a {kind!r} block, which the Messages API does not have "
                f"(it has {known})",
                where,
            )


def messages(body: dict[str, Any], *, counting: bool = False) -> None:
    """A Messages API request (counting: a token count, which has no max_tokens)."""
    if not counting and body.get("max_tokens") is None:
        raise _refuse(
            "max_tokens: the Messages API requires max_tokens, the most tokens to generate", "max_tokens"
        )
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise _refuse("messages must be a non-empty list of user and assistant turns", "messages")
    for i, turn in enumerate(turns):
        where = f"messages[{i}]"
        if not isinstance(turn, dict):
            raise _refuse(f"{where} must be an object with role and content", where)
        role = turn.get("role")
        # Claude Code (2.1, its `mid-conversation-system` beta) sends a system turn after the user's
        # first; only a chat completions body opens with one, its system prompt.
        if role not in _ROLES and not (role == "system" and i > 0):
            hint = (
                "; the system prompt goes in the request's top-level `system`, not in a message"
                if role == "system"
                else ""
            )
            raise _refuse(
                f"{where}.role is {role!r}: a Messages API turn is 'user' or 'assistant'{hint} (this "
                "looks like a chat completions body: send it to /v1/chat/completions)",
                where,
            )
        _blocks(turn.get("content"), where)
    system = body.get("system")
    if system is not None:
        _blocks(system, "system")


def count_tokens(body: dict[str, Any]) -> None:
    messages(body, counting=True)


# Inputs one /v1/embeddings request may hold: OpenAI's own limit. One request of 200,000 held its
# engine for minutes, every other request to that replica waiting, until the agent killed it.
MAX_EMBEDDING_INPUTS = 2048


def embeddings(body: dict[str, Any]) -> None:
    """Refuse, before anything is reserved, an embeddings request of more than MAX_EMBEDDING_INPUTS inputs."""
    inputs = body.get("input")
    # A list of token ids is one input; a list of strings, or of such lists, is one input each.
    if isinstance(inputs, list) and len(inputs) > MAX_EMBEDDING_INPUTS and not isinstance(inputs[0], int):
        raise ApiError(
            400,
            f"input holds {len(inputs):,} inputs; a request may hold at most {MAX_EMBEDDING_INPUTS:,}: "
            "send them in several requests",
            code="too_many_inputs",
            param="input",
        )
