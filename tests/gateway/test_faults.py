"""An engine that misbehaves: an endpoint's key struck out of a reply that arrives in pieces."""

from __future__ import annotations

import pytest

from llmgw.gateway.faults import KeyStrike

KEY = "sk-abc-sk-abc-123"


def _through(strike: KeyStrike, pieces: list[bytes]) -> bytes:
    return b"".join(strike.feed(p) for p in pieces) + strike.end()


class TestKeyStrike:
    @pytest.mark.parametrize("at", [0, 1, 7, 30])
    def test_the_key_is_struck_wherever_the_reply_is_cut(self, at: int) -> None:
        """A key cut at any byte, between two pieces or three, never reaches the client whole or in part."""
        body = b"x" * at + b'{"said": "' + KEY.encode() + b'", "and": "' + KEY.encode() + b'"}'
        struck = body.replace(KEY.encode(), b"[its key]")
        for cut in range(len(body) + 1):
            assert _through(KeyStrike(KEY), [body[:cut], body[cut:]]) == struck
            for second in range(cut, len(body) + 1):
                assert _through(KeyStrike(KEY), [body[:cut], body[cut:second], body[second:]]) == struck

    def test_a_piece_that_does_not_end_in_the_start_of_the_key_is_passed_on_whole_at_once(self) -> None:
        """A stream's events end in a blank line: none waits for the next, however many "s" it holds."""
        strike = KeyStrike(KEY)
        event = b'data: {"content": "sk sk- sk-abc-sk"}\n\n'
        assert strike.feed(event) == event
        assert strike.end() == b""

    def test_what_only_began_like_the_key_is_passed_on_in_the_next_piece_or_at_the_end(self) -> None:
        strike = KeyStrike(KEY)
        assert strike.feed(b"ends with sk-abc") == b"ends with "
        assert strike.feed(b"-1 and more") == b"sk-abc-1 and more"
        assert strike.feed(b"then sk-") == b"then "
        assert strike.end() == b"sk-"
