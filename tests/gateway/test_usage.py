"""The engine's reported usage is found in a reply or at the end of a stream, without parsing the rest."""

from __future__ import annotations

import json

from llmgw.gateway.usage import find_usage

USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}


def _event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class TestFindUsage:
    def test_it_is_read_from_a_non_streamed_reply(self) -> None:
        reply = json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": USAGE}).encode()
        assert find_usage(reply) == (12, 7)

    def test_a_stream_whose_chunks_say_null_gives_the_final_chunks_usage(self) -> None:
        chunks = [_event({"choices": [{"delta": {"content": "w"}}], "usage": None}) for _ in range(3)]
        tail = b"".join(chunks) + _event({"choices": [], "usage": USAGE}) + b"data: [DONE]\n\n"
        assert find_usage(tail) == (12, 7)

    def test_the_word_usage_inside_generated_text_is_not_mistaken_for_it(self) -> None:
        text = 'the "usage": {"prompt_tokens": 1, "completion_tokens": 1} field'
        assert find_usage(_event({"choices": [{"delta": {"content": text}}]})) is None

    def test_a_reply_without_usage_gives_none_rather_than_zeros(self) -> None:
        assert find_usage(_event({"choices": [], "usage": None}) + b"data: [DONE]\n\n") is None
        assert find_usage(b"") is None
