"""The gateway's checks that a Messages body is one (gateway/checks.py), on the bodies real clients send."""

from __future__ import annotations

import pytest

from llmgw.gateway import checks
from llmgw.gateway.errors import ApiError


def test_a_system_turn_after_the_first_is_claude_codes_and_passes() -> None:
    """Claude Code 2.1.197 sends its list of agents as a system turn after the user's first turn."""
    checks.messages(
        {
            "max_tokens": 32000,
            "system": [{"type": "text", "text": "You are a Claude agent."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "say hi"}]},
                {"role": "system", "content": "Available agent types for the Agent tool: ..."},
            ],
        }
    )


def test_a_body_opening_with_a_system_turn_is_a_chat_completions_body() -> None:
    body = {
        "max_tokens": 5,
        "messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}],
    }
    with pytest.raises(ApiError, match=r"messages\[0\]\.role is 'system'"):
        checks.messages(body)


def test_a_later_system_turn_is_held_to_the_messages_content_blocks() -> None:
    body = {
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "image_url", "image_url": {}}]},
        ],
    }
    with pytest.raises(ApiError, match=r"messages\[1\]\.content\[0\] is a 'image_url' block"):
        checks.messages(body)
